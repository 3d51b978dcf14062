// Package fakeskyrl is a FAKE of SkyRL tx's Tinker API server
// (skyrl/tinker/api.py and its engine), written from that source so that a
// Tinker client can be tested against an implementation it did not write.
// It is in-memory, needs no GPU, and must never stand in for a trainer.
//
// The protocol is SkyRL's: the routes, the request bodies and their
// validation (FastAPI's 422 list-of-errors detail, including the
// loss_fn_config key check), {"detail": …} errors with SkyRL's messages and
// statuses, futures answered {"future_id","status":"pending","request_id"}
// and completed asynchronously by a per-model engine in request order,
// retrieve_future's 200/400/404/408, per-(model_id, seq_id) deduplication
// of forward, forward_backward and optim_step (same body, same request_id;
// another body, 409), the LoadWeights-first rule, checkpoint bookkeeping
// (409 on a reused name, 425 while pending) and the sampler archive's
// 302-then-download.
//
// The model is the fake's own: a learnable logit table over Config.Vocab
// tokens, so logp(target | anything) = log_softmax(table)[target]. Losses
// follow skyrl/tinker/loss_fns.py (cross_entropy, importance_sampling, ppo
// and cispo, per-token losses masked by weights); a request's loss is the
// sum over datums of each datum's summed token losses divided by its summed
// weights, as the JAX backend computes it; forward_backward accumulates the
// gradient and optim_step divides it by the number of datums seen and
// applies optax.adamw with the request's adam_params, reporting
// skyrl.ai/grad_norm and skyrl.ai/learning_rate. Results carry
// loss_fn_output_type "scalar", per-datum elementwise_loss and logprobs,
// and empty metrics, as the JAX backend leaves them.
//
// save_weights_for_sampler writes a tar.gz holding a PEFT LoRA adapter
// (adapter_config.json and adapter_model.safetensors) on lm_head with
// in_features 1: lora_A is [r, 1] with A[0][0] = 1, lora_B is [Vocab, r]
// with B[:, 0] = table, so B·A is the table. lora_alpha is SkyRL's 32, so a
// reader that applies PEFT's alpha/r scaling gets the table times 32/r.
//
// Left out: sampling (asample, create_sampling_session, samplers), images
// (an image chunk fails its request), the protobuf bodies and results and
// zstd request bodies, training-run listing, weights_info, checkpoint
// deletion, session expiry and engine batching across models. Losses the
// JAX backend rejects (gspo, ppo_critic, dppo) fail their request as it
// does.
//
// Tests drive the fake's faults through Server.Faults (fail the next N
// requests to a route, delay processing) and read its counters
// (Server.Requests, Server.OptimSteps, Server.SamplerSaves).
package fakeskyrl
