package fakeskyrl

// The request and answer bodies of skyrl/tinker/api.py and the results of
// skyrl/tinker/types.py. Pointers mark the fields pydantic requires, so
// that a missing one can be told from a zero one.

type createSessionRequest struct {
	Tags         *[]string      `json:"tags"`
	UserMetadata map[string]any `json:"user_metadata"`
	SDKVersion   *string        `json:"sdk_version"`
}

type createSessionResponse struct {
	Type           string  `json:"type"`
	InfoMessage    *string `json:"info_message"`
	WarningMessage *string `json:"warning_message"`
	ErrorMessage   *string `json:"error_message"`
	SessionID      string  `json:"session_id"`
}

type sessionHeartbeatRequest struct {
	SessionID *string `json:"session_id"`
}

type loraConfigIn struct {
	Rank *int   `json:"rank"`
	Seed *int64 `json:"seed"`
}

type createModelRequest struct {
	SessionID  *string       `json:"session_id"`
	BaseModel  *string       `json:"base_model"`
	LoraConfig *loraConfigIn `json:"lora_config"`
	ModelRole  *string       `json:"model_role"`
}

type createModelResponse struct {
	ModelID    string       `json:"model_id"`
	BaseModel  string       `json:"base_model"`
	LoraConfig loraConfigIn `json:"lora_config"`
	Status     string       `json:"status"`
	RequestID  string       `json:"request_id"`
}

// loraConfig is types.LoraConfig, what the engine keeps and answers.
type loraConfig struct {
	Rank         int     `json:"rank"`
	Alpha        float64 `json:"alpha"`
	Seed         int64   `json:"seed"`
	TrainAttn    bool    `json:"train_attn"`
	TrainMLP     bool    `json:"train_mlp"`
	TrainUnembed bool    `json:"train_unembed"`
}

type modelIDRequest struct {
	ModelID *string `json:"model_id"`
}

type unloadModelResponse struct {
	RequestID string `json:"request_id"`
	ModelID   string `json:"model_id"`
}

type modelInfoResponse struct {
	ModelID   string    `json:"model_id"`
	Status    string    `json:"status"`
	ModelData modelData `json:"model_data"`
}

type modelData struct {
	BaseModel  string       `json:"base_model"`
	LoraConfig loraConfigIn `json:"lora_config"`
	ModelName  string       `json:"model_name"`
}

// chunk is one of the ModelInputChunk union; only encoded_text is served.
type chunk struct {
	Type     string  `json:"type"`
	Tokens   *[]int  `json:"tokens"`
	Data     *string `json:"data"`
	Location *string `json:"location"`
}

type modelInput struct {
	Chunks *[]chunk `json:"chunks"`
}

type tensorData struct {
	Data *[]float64 `json:"data"`
}

type datum struct {
	LossFnInputs *map[string]tensorData `json:"loss_fn_inputs"`
	ModelInput   *modelInput            `json:"model_input"`
}

type forwardBackwardInput struct {
	Data         *[]datum           `json:"data"`
	LossFn       *string            `json:"loss_fn"`
	LossFnConfig map[string]float64 `json:"loss_fn_config"`
}

type forwardBackwardRequest struct {
	ModelID              *string               `json:"model_id"`
	ForwardBackwardInput *forwardBackwardInput `json:"forward_backward_input"`
	SeqID                *int64                `json:"seq_id"`
}

type forwardRequest struct {
	ModelID      *string               `json:"model_id"`
	ForwardInput *forwardBackwardInput `json:"forward_input"`
	SeqID        *int64                `json:"seq_id"`
}

// adamParamsIn holds pointers so that SkyRL's defaults can fill what a
// request leaves out.
type adamParamsIn struct {
	LearningRate *float64 `json:"learning_rate"`
	Beta1        *float64 `json:"beta1"`
	Beta2        *float64 `json:"beta2"`
	Eps          *float64 `json:"eps"`
	WeightDecay  *float64 `json:"weight_decay"`
}

type optimStepRequest struct {
	ModelID    *string       `json:"model_id"`
	AdamParams *adamParamsIn `json:"adam_params"`
	SeqID      *int64        `json:"seq_id"`
}

type saveWeightsRequest struct {
	ModelID *string `json:"model_id"`
	Path    *string `json:"path"`
}

type saveWeightsForSamplerRequest struct {
	ModelID              *string `json:"model_id"`
	Path                 *string `json:"path"`
	SamplingSessionSeqID *int64  `json:"sampling_session_seq_id"`
	SeqID                *int64  `json:"seq_id"`
}

type loadWeightsRequest struct {
	ModelID   *string `json:"model_id"`
	Path      *string `json:"path"`
	Optimizer *bool   `json:"optimizer"`
	SeqID     *int64  `json:"seq_id"`
}

type retrieveFutureRequest struct {
	RequestID *string `json:"request_id"`
}

type futureResponse struct {
	FutureID  string `json:"future_id"`
	Status    string `json:"status"`
	RequestID string `json:"request_id"`
}

type supportedModel struct {
	ModelName string `json:"model_name"`
}

type serverCapabilities struct {
	SupportedModels []supportedModel `json:"supported_models"`
}

type checkpointEntry struct {
	CheckpointID   string `json:"checkpoint_id"`
	CheckpointType string `json:"checkpoint_type"`
	Time           string `json:"time"`
	TinkerPath     string `json:"tinker_path"`
}

type listCheckpointsResponse struct {
	Checkpoints []checkpointEntry `json:"checkpoints"`
}

// The stored results of futures (types.*Output and types.ErrorResponse).

type createModelOutput struct {
	ModelID    string     `json:"model_id"`
	BaseModel  string     `json:"base_model"`
	LoraConfig loraConfig `json:"lora_config"`
}

type tensorOut struct {
	Data  []float32 `json:"data"`
	DType string    `json:"dtype"`
	Shape []int     `json:"shape"`
}

type lossFnOutput struct {
	ElementwiseLoss tensorOut `json:"elementwise_loss"`
	Logprobs        tensorOut `json:"logprobs"`
}

type forwardBackwardOutput struct {
	LossFnOutputType string         `json:"loss_fn_output_type"`
	LossFnOutputs    []lossFnOutput `json:"loss_fn_outputs"`
	Metrics          map[string]any `json:"metrics"`
}

type optimStepOutput struct {
	Metrics map[string]float64 `json:"metrics"`
}

type saveWeightsOutput struct {
	Path string `json:"path"`
	Type string `json:"type"`
}

type saveWeightsForSamplerOutput struct {
	Path              *string `json:"path"`
	Type              string  `json:"type"`
	SamplingSessionID *string `json:"sampling_session_id"`
}

type loadWeightsOutput struct {
	Type string `json:"type"`
}

type unloadModelOutput struct {
	ModelID string `json:"model_id"`
	Status  string `json:"status"`
	Type    string `json:"type"`
}

type errorResponse struct {
	Error  string `json:"error"`
	Status string `json:"status"`
}
