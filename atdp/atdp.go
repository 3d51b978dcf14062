// Package atdp is the Agent Trajectory Data Protocol: one JSON object per
// step, the six-tuple ⟨o, h, a, y, r, m⟩ (observation, internal state,
// action, result, reward, metadata), versioned by atdp_version. It owns the
// Go types, the JSON Schema that ships with them, validation and a strict
// decoder for outside input. It must not know about HTTP, Postgres or
// Temporal: the gateway exports steps and the workflows assemble them.
package atdp

// Version is the protocol version every step carries. Bumping it is an
// explicit, schema-changing decision.
const Version = "1"

// Step is one ATDP step ⟨o, h, a, y, r, m⟩.
type Step struct {
	ATDPVersion   string        `json:"atdp_version"`
	Observation   Observation   `json:"observation"`
	InternalState InternalState `json:"internal_state"`
	Action        Action        `json:"action"`
	Result        Result        `json:"result"`
	Reward        Reward        `json:"reward"`
	Metadata      Metadata      `json:"metadata"`
}

// Observation (o) is what the model saw.
type Observation struct {
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools,omitempty"`
	// Context is retrieved context the agent supplied, if it said so.
	Context []ContextItem `json:"context,omitempty"`
	// Memory is the playbook items the gateway injected.
	Memory []MemoryItem `json:"memory,omitempty"`
}

// Message is one chat message.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content,omitempty"`
	Name       string     `json:"name,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// ToolCall is a function call by the model; Arguments is its raw JSON text.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is a function offered to the model; Parameters is a JSON Schema.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Parameters  any    `json:"parameters,omitempty"`
	// Version is the tool-schema artefact version applied, if any.
	Version string `json:"version,omitempty"`
}

// ContextItem is a piece of retrieved context.
type ContextItem struct {
	Source  string `json:"source,omitempty"`
	Content string `json:"content"`
}

// MemoryItem is a playbook entry used for this step.
type MemoryItem struct {
	ID      string `json:"id"`
	Content string `json:"content"`
	Version string `json:"version,omitempty"`
}

// InternalState (h) is what the model exposed of its reasoning; empty in
// the POMDP case.
type InternalState struct {
	Reasoning  string   `json:"reasoning,omitempty"`
	Confidence *float64 `json:"confidence,omitempty"`
}

// Action (a) is the model's output and the tokens that produced it.
type Action struct {
	Message Message `json:"message"`
	Tokens  Tokens  `json:"tokens"`
}

// Tokens are the behaviour policy's token ids and per-token logprobs;
// Logprobs and Versions align with CompletionIDs (Versions may be one
// entry when a single version produced every token).
type Tokens struct {
	PromptIDs     []int     `json:"prompt_ids"`
	CompletionIDs []int     `json:"completion_ids"`
	Logprobs      []float64 `json:"logprobs"`
	Versions      []string  `json:"versions"`
}

// Result (y) is what happened after the action.
type Result struct {
	FinishReason string `json:"finish_reason"`
	// ToolResults are the tool messages that followed this step.
	ToolResults []Message `json:"tool_results,omitempty"`
	LatencyMS   float64   `json:"latency_ms"`
	Error       string    `json:"error,omitempty"`
}

// DefaultDiscount is γ, the discount of Reward.Return, when neither the
// session nor the worker's configuration sets one: 1, the undiscounted
// return. It lives here, beside the return it discounts, so that the
// configuration and the assembly read the same default.
const DefaultDiscount = 1.0

// Reward (r) is every reward bound to the step, merged and discounted.
type Reward struct {
	Values []RewardValue `json:"values"`
	// Merged is the source-weighted value; nil when none arrived.
	Merged *float64 `json:"merged"`
	// Return is the discounted return from this step; nil when unknown.
	Return *float64 `json:"return"`
}

// RewardValue is one reward as it arrived.
type RewardValue struct {
	Value  float64 `json:"value"`
	Source string  `json:"source"`
	// At is RFC 3339.
	At string `json:"at"`
}

// Metadata (m) identifies the step and records how it may be used.
type Metadata struct {
	TrajectoryID string `json:"trajectory_id"`
	SessionID    string `json:"session_id"`
	StepID       string `json:"step_id"`
	StepIndex    int    `json:"step_index"`
	ParentStepID string `json:"parent_step_id,omitempty"`
	CompletionID string `json:"completion_id,omitempty"`
	Tenant       string `json:"tenant"`
	Model        string `json:"model"`
	ModelVersion string `json:"model_version"`
	// ToolVersions maps tool name → tool-schema version applied.
	ToolVersions map[string]string `json:"tool_versions,omitempty"`
	Usage        Usage             `json:"usage"`
	CostUSD      float64           `json:"cost_usd,omitempty"`
	Redactions   []Redaction       `json:"redactions"`
	Consent      Consent           `json:"consent"`
	Eligibility  Eligibility       `json:"eligibility"`
	// CreatedAt is RFC 3339.
	CreatedAt string `json:"created_at"`
}

// Usage counts tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// Redaction records one redaction applied (never the original text).
type Redaction struct {
	Kind string `json:"kind"`
	// Field locates it, e.g. "observation.messages[2].content".
	Field string `json:"field"`
	Count int    `json:"count"`
}

// Consent is the data-use decision for the step.
type Consent struct {
	OptOut bool `json:"opt_out"`
	// Basis says where the decision came from: tenant_default, session,
	// end_user.
	Basis string `json:"basis"`
}

// Reasons a step will not train.
const (
	ReasonNoReward            = "no_reward"
	ReasonUpstreamError       = "upstream_error"
	ReasonZeroTrainableTokens = "zero_trainable_tokens"
	ReasonStaleVersion        = "stale_version"
	// ReasonRedactedPII: personal data was redacted from text that the
	// step's token ids spell, and the ids cannot be rebuilt without it.
	ReasonRedactedPII = "redacted_pii"
	// ReasonArrivedAfterTraining: a reward changed the step's return after
	// its sample had trained; the sample keeps the return it trained with.
	ReasonArrivedAfterTraining = "arrived_after_training"
	ReasonOptedOut             = "opted_out"
	ReasonFilteredGroup        = "filtered_group"
	ReasonPending              = "pending"
)

// Eligibility says whether the step will train and, if not, why.
type Eligibility struct {
	Trainable bool   `json:"trainable"`
	Reason    string `json:"reason,omitempty"`
}
