//! Requests of `rredcot serve` as they arrive: the JSON bodies of `/v1/chat/completions` and
//! `/v1/completions` parsed and checked, and what the server refuses (a 400 with OpenAI's error
//! shape, naming the field) rather than ignore.

use serde_json::{json, Value};

use super::stream::StreamOptions;
use crate::model::{ChatMessage, SamplingParams};

/// Largest `n` per request.
const MAX_N: usize = 16;

/// A request rejected before generation: HTTP status and message.
#[derive(Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

pub(super) fn bad(message: impl Into<String>) -> ApiError {
    ApiError { status: 400, message: message.into() }
}

pub(super) fn error_body(e: &ApiError) -> Value {
    let kind = if e.status >= 500 { "server_error" } else { "invalid_request_error" };
    json!({ "error": { "message": e.message, "type": kind, "param": null, "code": null } })
}

/// A parsed `/v1/chat/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatBody {
    /// `model`, when given: the server answers only for the model it serves.
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub sampling: SamplingParams,
    pub n: usize,
    pub seed: Option<u64>,
    pub stream: Option<StreamOptions>,
    /// `logprobs` / `top_logprobs`: `None` = no logprobs; `Some(k)` = each token's and its top k.
    pub logprobs: Option<usize>,
    /// `add_generation_prompt` (default true): the assistant turn is opened.
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs.enable_thinking` (default true; Qwen3's template reads it).
    pub enable_thinking: bool,
    pub output: OutputOptions,
}

/// vLLM's request fields that shape a choice's end and text, both endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputOptions {
    /// `ignore_eos`: the model's end-of-sequence tokens do not end a choice (`stop`,
    /// `stop_token_ids` and `max_tokens` still do).
    pub ignore_eos: bool,
    /// `skip_special_tokens` (default true): special tokens are left out of the text.
    pub skip_special_tokens: bool,
    /// `include_stop_str_in_output`: the text keeps the stop string that ended it.
    pub include_stop_str: bool,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions { ignore_eos: false, skip_special_tokens: true, include_stop_str: false }
    }
}

/// A boolean field, `default` when absent or null.
fn flag(obj: &serde_json::Map<String, Value>, name: &str, default: bool) -> Result<bool, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| bad(format!("`{name}` must be a boolean"))),
    }
}

/// [`OutputOptions`] of a body.
fn parse_output(obj: &serde_json::Map<String, Value>) -> Result<OutputOptions, ApiError> {
    Ok(OutputOptions {
        ignore_eos: flag(obj, "ignore_eos", false)?,
        skip_special_tokens: flag(obj, "skip_special_tokens", true)?,
        include_stop_str: flag(obj, "include_stop_str_in_output", false)?,
    })
}

/// `chat_template_kwargs`: only `enable_thinking` (a boolean) is known; any other key would
/// change the prompt in a way this server cannot, so it is refused.
fn parse_enable_thinking(obj: &serde_json::Map<String, Value>) -> Result<bool, ApiError> {
    let kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => return Ok(true),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("`chat_template_kwargs` must be an object")),
    };
    if let Some(k) = kwargs.keys().find(|k| *k != "enable_thinking") {
        return Err(bad(format!("`chat_template_kwargs.{k}` is not supported by rredcot serve (only `enable_thinking` is)")));
    }
    flag(kwargs, "enable_thinking", true)
}

/// The text of a message's `content`: a string, or an array of `{type: "text", text}` parts.
fn content_text(v: &Value, i: usize) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        v => rredcot::prompt_text::message_content_text(v).ok_or_else(|| match v {
            Value::Array(_) => bad(format!("messages[{i}].content: only text parts are supported")),
            _ => bad(format!("messages[{i}].content must be a string or an array of text parts")),
        }),
    }
}

/// Parses and validates a chat completion request; `max_new_tokens` is the server's default and
/// upper bound for `max_tokens`.
pub fn parse_chat(body: &[u8], max_new_tokens: usize) -> Result<ChatBody, ApiError> {
    let obj = body_object(body)?;
    let msgs = obj.get("messages").and_then(Value::as_array).ok_or_else(|| bad("`messages` (an array) is required"))?;
    if msgs.is_empty() {
        return Err(bad("`messages` is empty"));
    }
    let messages = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| bad(format!("messages[{i}].role must be a string")))?;
            if !["system", "developer", "user", "assistant"].contains(&role) {
                return Err(bad(format!("messages[{i}].role `{role}` is not supported")));
            }
            let role = if role == "developer" { "system" } else { role };
            Ok(ChatMessage::new(role, &content_text(m.get("content").unwrap_or(&Value::Null), i)?))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (sampling, n, seed) = parse_sampling(&obj, max_new_tokens)?;
    let stream = parse_stream(&obj)?;
    let logprobs = flag(&obj, "logprobs", false)?;
    let top = match obj.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(k) if k as usize <= MAX_LOGPROBS => Some(k as usize),
            _ => return Err(bad(format!("`top_logprobs` must be an integer in 0..={MAX_LOGPROBS}"))),
        },
    };
    if top.is_some() && !logprobs {
        return Err(bad("`top_logprobs` needs logprobs = true"));
    }
    let logprobs = logprobs.then(|| top.unwrap_or(0));
    let add_generation_prompt = flag(&obj, "add_generation_prompt", true)?;
    let enable_thinking = parse_enable_thinking(&obj)?;
    Ok(ChatBody { model: parse_model(&obj)?, messages, sampling, n, seed, stream, logprobs, add_generation_prompt, enable_thinking, output: parse_output(&obj)? })
}

/// The `model` a request names (OpenAI requires one; vLLM takes its served model without).
fn parse_model(obj: &serde_json::Map<String, Value>) -> Result<Option<String>, ApiError> {
    match obj.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(m)) => Ok(Some(m.clone())),
        Some(_) => Err(bad("`model` must be a string")),
    }
}

/// The request fields this server reads (either endpoint).
const READ: &[&str] = &[
    "model", "messages", "prompt", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "n", "seed", "stop",
    "stop_token_ids", "stream", "stream_options", "logprobs", "top_logprobs", "return_tokens_as_token_ids", "return_token_ids",
    "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "add_generation_prompt", "chat_template_kwargs",
];

/// Fields that change nothing this server generates or sends, whatever they hold (labels,
/// scheduling and billing hints, how often a stream sends, a reasoning field no parser fills).
const INERT: &[&str] = &[
    "user", "request_id", "session_id", "cache_salt", "stream_interval", "parallel_tool_calls", "service_tier", "store",
    "metadata", "include_reasoning",
];

/// Request fields (OpenAI's and vLLM's extra ones) that would change what is generated or sent,
/// which this server does not do: refused (400) unless they hold their do-nothing value, rather
/// than silently ignored. A field no one here knows is logged as ignored, as vLLM does.
fn refuse_unsupported(obj: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    // `None`: not one of these fields; `Some(inert)`: whether `v` is its do-nothing value (a
    // field whose only such value is null, as all are, gets false).
    let inert = |name: &str, v: &Value| -> Option<bool> {
        Some(match name {
            "presence_penalty" | "frequency_penalty" | "min_p" => v.as_f64() == Some(0.0),
            "repetition_penalty" | "length_penalty" => v.as_f64() == Some(1.0),
            "min_tokens" | "priority" => v.as_u64() == Some(0),
            "best_of" => v.as_u64().is_some_and(|b| b <= 1),
            "logit_bias" => v.as_object().is_some_and(|o| o.is_empty()),
            "tools" | "functions" | "bad_words" | "documents" => v.as_array().is_some_and(|a| a.is_empty()),
            "tool_choice" | "function_call" => v.as_str() == Some("none"),
            "response_format" => v.get("type").and_then(Value::as_str) == Some("text"),
            "modalities" => v.as_array().is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text"))),
            "suffix" => v.as_str() == Some(""),
            "echo" | "use_beam_search" | "early_stopping" | "continue_final_message" | "add_special_tokens" | "watermarking"
            | "return_token_offsets" | "return_prompt_text" | "return_mm_kwargs" => v.as_bool() == Some(false),
            "spaces_between_special_tokens" | "detokenize" => v.as_bool() == Some(true),
            "guided_json" | "guided_regex" | "guided_choice" | "guided_grammar" | "guided_decoding_backend" | "structured_outputs"
            | "allowed_token_ids" | "prompt_logprobs" | "logprob_token_ids" | "truncate_prompt_tokens" | "truncation_side"
            | "chat_template" | "reasoning_effort" | "thinking_token_budget" | "repetition_detection" | "vllm_xargs"
            | "logits_processors" | "mm_processor_kwargs" | "media_io_kwargs" | "mm_payload" | "prompt_embeds" | "audio"
            | "prediction" | "web_search_options" | "kv_transfer_params" | "ec_transfer_params" => false,
            _ => return None,
        })
    };
    let mut ignored = Vec::new();
    for (name, v) in obj {
        match inert(name, v) {
            Some(false) if !v.is_null() => return Err(bad(format!("`{name}` is not supported by rredcot serve"))),
            Some(_) => {}
            None if READ.contains(&name.as_str()) || INERT.contains(&name.as_str()) => {}
            None => ignored.push(name.as_str()),
        }
    }
    if !ignored.is_empty() {
        tracing::warn!("request fields unknown to rredcot serve, ignored: {}", ignored.join(", "));
    }
    Ok(())
}

/// A request body as a JSON object.
fn body_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("request body is not JSON: {e}")))?;
    let Value::Object(obj) = v else { return Err(bad("request body must be a JSON object")) };
    Ok(obj)
}

/// `stream` and `stream_options`: `None` for a whole reply.
fn parse_stream(obj: &serde_json::Map<String, Value>) -> Result<Option<StreamOptions>, ApiError> {
    let stream = flag(obj, "stream", false)?;
    let options = match obj.get("stream_options") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o),
        Some(_) => return Err(bad("`stream_options` must be an object")),
    };
    if !stream {
        return match options {
            Some(_) => Err(bad("`stream_options` is only allowed with stream = true")),
            None => Ok(None),
        };
    }
    let include_usage = match options.and_then(|o| o.get("include_usage")) {
        None | Some(Value::Null) => false,
        Some(v) => v.as_bool().ok_or_else(|| bad("`stream_options.include_usage` must be a boolean"))?,
    };
    Ok(Some(StreamOptions { include_usage }))
}

/// The sampling fields both endpoints share: params, `n` and `seed`.
fn parse_sampling(obj: &serde_json::Map<String, Value>, max_new_tokens: usize) -> Result<(SamplingParams, usize, Option<u64>), ApiError> {
    refuse_unsupported(obj)?;
    let num = |name: &str, default: f64| -> Result<f64, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_f64().filter(|f| f.is_finite()).ok_or_else(|| bad(format!("`{name}` must be a number"))),
        }
    };
    let int = |name: &str| -> Result<Option<u64>, ApiError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_u64().map(Some).ok_or_else(|| bad(format!("`{name}` must be a non-negative integer"))),
        }
    };
    let temperature = num("temperature", 1.0)?;
    let top_p = num("top_p", 1.0)?;
    // OpenAI's range; the rest of the sampling params are checked below as every sampler's are.
    if !(0.0..=2.0).contains(&temperature) {
        return Err(bad(format!("temperature {temperature} is outside [0, 2]")));
    }
    let top_k = match obj.get("top_k") {
        None | Some(Value::Null) => 0,
        Some(x) => x.as_i64().map(|k| k.max(0)).ok_or_else(|| bad("`top_k` must be an integer"))?,
    };
    let max_tokens = match (int("max_completion_tokens")?, int("max_tokens")?) {
        (Some(m), _) | (None, Some(m)) => (m as usize).min(max_new_tokens),
        (None, None) => max_new_tokens,
    };
    if max_tokens == 0 {
        return Err(bad("max_tokens must be at least 1"));
    }
    let n = int("n")?.unwrap_or(1) as usize;
    if !(1..=MAX_N).contains(&n) {
        return Err(bad(format!("n = {n} is outside 1..={MAX_N}")));
    }
    let stop_strings = match obj.get("stop") {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(String::from).ok_or_else(|| bad("`stop` must be a string or an array of strings")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("`stop` must be a string or an array of strings")),
    };
    let stop_token_ids = match obj.get("stop_token_ids") {
        None | Some(Value::Null) => vec![],
        Some(v) => token_ids(v).ok_or_else(|| bad("`stop_token_ids` must be an array of token ids"))?,
    };
    let sampling = SamplingParams { temperature, top_p, top_k, max_new_tokens: max_tokens, stop_strings, stop_token_ids };
    if let Some(why) = sampling.invalid() {
        return Err(bad(why));
    }
    // A seed is 64 bits, written unsigned or (as vLLM validates it, and as rredcot's http
    // backend sends it) signed: -1 is seed 2^64 - 1.
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => None,
        Some(x) => Some(x.as_u64().or_else(|| x.as_i64().map(|s| s as u64)).ok_or_else(|| bad("`seed` must be a 64-bit integer"))?),
    };
    Ok((sampling, n, seed))
}

/// A JSON array of non-negative integers as token ids.
fn token_ids(v: &Value) -> Option<Vec<i64>> {
    v.as_array()?.iter().map(|x| x.as_u64().and_then(|t| i64::try_from(t).ok())).collect()
}

/// Most top tokens per position a completion request may ask for (`logprobs`).
const MAX_LOGPROBS: usize = 20;

/// A completion's prompt: text (tokenized without a chat template) or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<i64>),
}

/// How a `/v1/completions` reply reports tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionFormat {
    /// `logprobs`: `None` = no logprobs object; `Some(k)` = chosen-token logprobs and the top k.
    pub logprobs: Option<usize>,
    /// `return_tokens_as_token_ids`: tokens written `"token_id:123"`.
    pub ids_as_tokens: bool,
    /// `return_token_ids`: each choice carries its `token_ids`.
    pub return_ids: bool,
}

/// A parsed `/v1/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionBody {
    /// As [`ChatBody::model`].
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub sampling: SamplingParams,
    pub n: usize,
    pub seed: Option<u64>,
    pub format: CompletionFormat,
    pub stream: Option<StreamOptions>,
    pub output: OutputOptions,
}

/// Parses and validates a completion request (one prompt per request); `max_new_tokens` as in
/// [`parse_chat`].
pub fn parse_completion(body: &[u8], max_new_tokens: usize) -> Result<CompletionBody, ApiError> {
    let obj = body_object(body)?;
    let one = "`prompt` must be a string or a list of token ids (one prompt per request)";
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => return Err(bad("`prompt` is required")),
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && !a[0].is_number() => match &a[0] {
            Value::String(s) => PromptInput::Text(s.clone()),
            v => PromptInput::Ids(token_ids(v).ok_or_else(|| bad(one))?),
        },
        Some(v) => PromptInput::Ids(token_ids(v).ok_or_else(|| bad(one))?),
    };
    if matches!(&prompt, PromptInput::Ids(ids) if ids.is_empty()) || matches!(&prompt, PromptInput::Text(t) if t.is_empty()) {
        return Err(bad("`prompt` is empty"));
    }
    let logprobs = match obj.get("logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(k) if k as usize <= MAX_LOGPROBS => Some(k as usize),
            _ => return Err(bad(format!("`logprobs` must be an integer in 0..={MAX_LOGPROBS}"))),
        },
    };
    let format = CompletionFormat {
        logprobs,
        ids_as_tokens: flag(&obj, "return_tokens_as_token_ids", false)?,
        return_ids: flag(&obj, "return_token_ids", false)?,
    };
    let (sampling, n, seed) = parse_sampling(&obj, max_new_tokens)?;
    let stream = parse_stream(&obj)?;
    Ok(CompletionBody { model: parse_model(&obj)?, prompt, sampling, n, seed, format, stream, output: parse_output(&obj)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_bodies_parse_with_openai_defaults() {
        let b = parse_chat(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#, 64).unwrap();
        assert_eq!(b.messages, vec![ChatMessage::new("user", "hi")]);
        assert_eq!((b.sampling.temperature, b.sampling.top_p, b.sampling.max_new_tokens, b.n, b.seed), (1.0, 1.0, 64, 1, None));
        let b = parse_chat(
            br#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"q"}],
                "temperature":0,"top_p":0.9,"max_tokens":1000,"n":3,"seed":7,"stop":"\n\n","top_k":5}"#,
            64,
        )
        .unwrap();
        assert_eq!(b.messages[0], ChatMessage::new("system", "ab"));
        assert_eq!((b.sampling.temperature, b.sampling.top_p, b.sampling.top_k), (0.0, 0.9, 5));
        assert_eq!((b.sampling.max_new_tokens, b.n, b.seed), (64, 3, Some(7)));
        assert_eq!(b.sampling.stop_strings, vec!["\n\n".to_string()]);
        assert_eq!(b.stream, None);
        let streamed = |body: &[u8]| parse_chat(body, 64).unwrap().stream;
        assert_eq!(streamed(br#"{"messages":[{"role":"user","content":"q"}],"stream":true}"#), Some(StreamOptions { include_usage: false }));
        assert_eq!(
            streamed(br#"{"messages":[{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true}}"#),
            Some(StreamOptions { include_usage: true })
        );
        assert_eq!(streamed(br#"{"messages":[{"role":"user","content":"q"}],"stream":false}"#), None);
        let logprobs = |body: &[u8]| parse_chat(body, 64).unwrap().logprobs;
        assert_eq!(logprobs(br#"{"messages":[{"role":"user","content":"q"}]}"#), None);
        assert_eq!(logprobs(br#"{"messages":[{"role":"user","content":"q"}],"logprobs":true}"#), Some(0));
        assert_eq!(logprobs(br#"{"messages":[{"role":"user","content":"q"}],"logprobs":true,"top_logprobs":3}"#), Some(3));
        // Fields at their do-nothing values are accepted (clients send them so).
        let inert = br#"{"messages":[{"role":"user","content":"q"}],"presence_penalty":0,"frequency_penalty":0.0,"logit_bias":{},
                         "tools":[],"tool_choice":"none","response_format":{"type":"text"},"user":"u","min_p":0,"repetition_penalty":1}"#;
        assert!(parse_chat(inert, 64).is_ok());
    }

    #[test]
    fn completion_bodies_take_token_ids_or_text_and_logprob_options() {
        let b = parse_completion(br#"{"model":"m","prompt":[5,6,7],"n":4,"seed":18446744073709551615,"logprobs":0,"return_tokens_as_token_ids":true,"stop_token_ids":[2]}"#, 64).unwrap();
        assert_eq!((b.prompt, b.n, b.seed), (PromptInput::Ids(vec![5, 6, 7]), 4, Some(u64::MAX)));
        assert_eq!(b.format, CompletionFormat { logprobs: Some(0), ids_as_tokens: true, return_ids: false });
        assert_eq!(b.sampling.stop_token_ids, vec![2]);
        assert_eq!(parse_completion(br#"{"prompt":[[5,6]],"return_token_ids":true}"#, 64).unwrap().prompt, PromptInput::Ids(vec![5, 6]));
        // vLLM's signed seeds: the same 64 bits.
        assert_eq!(parse_completion(br#"{"prompt":[1],"seed":-1}"#, 64).unwrap().seed, Some(u64::MAX));
        assert_eq!(parse_completion(br#"{"prompt":[1],"seed":-9223372036854775808}"#, 64).unwrap().seed, Some(1 << 63));
        // A stream takes them all: they come whole with each choice's last chunk.
        let b = parse_completion(br#"{"prompt":[1],"stream":true,"logprobs":2,"return_token_ids":true,"return_tokens_as_token_ids":true}"#, 64).unwrap();
        assert_eq!((b.stream.is_some(), b.format), (true, CompletionFormat { logprobs: Some(2), ids_as_tokens: true, return_ids: true }));
        let b = parse_completion(br#"{"prompt":"2+2=","max_tokens":3,"logprobs":5}"#, 64).unwrap();
        assert_eq!((b.prompt, b.sampling.max_new_tokens, b.format.logprobs), (PromptInput::Text("2+2=".into()), 3, Some(5)));
        for (body, want) in [
            (&br#"{"n":2}"#[..], "`prompt` is required"),
            (br#"{"prompt":[]}"#, "empty"),
            (br#"{"prompt":[[1],[2]]}"#, "one prompt per request"),
            (br#"{"prompt":[1,-2]}"#, "token ids"),
            (br#"{"prompt":[1],"logprobs":50}"#, "logprobs"),
            (br#"{"prompt":[1],"echo":true}"#, "echo"),
            (br#"{"prompt":[1],"return_tokens_as_token_ids":"yes"}"#, "boolean"),
            (br#"{"prompt":[1],"seed":1.5}"#, "64-bit integer"),
        ] {
            let e = parse_completion(body, 16).unwrap_err();
            assert!(e.status == 400 && e.message.contains(want), "{}: {}", String::from_utf8_lossy(body), e.message);
        }
    }

    #[test]
    fn vllm_output_options_and_template_kwargs_parse() {
        let q = r#""messages":[{"role":"user","content":"q"}]"#;
        let chat = |extra: &str| parse_chat(format!("{{{q}{extra}}}").as_bytes(), 64);
        let b = chat("").unwrap();
        assert_eq!((b.output, b.add_generation_prompt, b.enable_thinking), (OutputOptions::default(), true, true));
        assert_eq!(b.output, OutputOptions { ignore_eos: false, skip_special_tokens: true, include_stop_str: false });
        let b = chat(r#","ignore_eos":true,"skip_special_tokens":false,"include_stop_str_in_output":true,"add_generation_prompt":false,"chat_template_kwargs":{"enable_thinking":false}"#).unwrap();
        assert_eq!(b.output, OutputOptions { ignore_eos: true, skip_special_tokens: false, include_stop_str: true });
        assert_eq!((b.add_generation_prompt, b.enable_thinking), (false, false));
        let c = parse_completion(br#"{"prompt":[1],"ignore_eos":true,"include_stop_str_in_output":true}"#, 8).unwrap();
        assert_eq!(c.output, OutputOptions { ignore_eos: true, skip_special_tokens: true, include_stop_str: true });
        // vLLM's fields at their do-nothing values, labels and hints, and a field no one knows
        // (logged as ignored) are accepted.
        assert!(chat(r#","min_tokens":0,"bad_words":[],"echo":false,"use_beam_search":false,"length_penalty":1.0,"spaces_between_special_tokens":true,
                     "priority":0,"best_of":1,"add_special_tokens":false,"continue_final_message":false,"modalities":["text"],"user":"u",
                     "request_id":"r","stream_interval":2,"include_reasoning":true,"metadata":{"a":"b"},"chat_template":null,"no_such_field":3"#)
            .is_ok());
        // What they would change and is not done here is refused, naming the field.
        for (extra, want) in [
            (r#","min_tokens":5"#, "`min_tokens`"),
            (r#","bad_words":["x"]"#, "`bad_words`"),
            (r#","allowed_token_ids":[1,2]"#, "`allowed_token_ids`"),
            (r#","prompt_logprobs":1"#, "`prompt_logprobs`"),
            (r#","echo":true"#, "`echo`"),
            (r#","continue_final_message":true"#, "`continue_final_message`"),
            (r#","chat_template":"{{ messages }}""#, "`chat_template`"),
            (r#","add_special_tokens":true"#, "`add_special_tokens`"),
            (r#","truncate_prompt_tokens":5"#, "`truncate_prompt_tokens`"),
            (r#","use_beam_search":true"#, "`use_beam_search`"),
            (r#","length_penalty":0.5"#, "`length_penalty`"),
            (r#","spaces_between_special_tokens":false"#, "`spaces_between_special_tokens`"),
            (r#","structured_outputs":{"json":{}}"#, "`structured_outputs`"),
            (r#","priority":1"#, "`priority`"),
            (r#","reasoning_effort":"low""#, "`reasoning_effort`"),
            (r#","best_of":2"#, "`best_of`"),
            (r#","chat_template_kwargs":{"tools":[]}"#, "`chat_template_kwargs.tools`"),
            (r#","chat_template_kwargs":{"enable_thinking":"no"}"#, "`enable_thinking` must be a boolean"),
            (r#","chat_template_kwargs":[1]"#, "must be an object"),
            (r#","ignore_eos":1"#, "`ignore_eos` must be a boolean"),
            (r#","skip_special_tokens":"no""#, "`skip_special_tokens` must be a boolean"),
        ] {
            let e = chat(extra).unwrap_err();
            assert!(e.status == 400 && e.message.contains(want), "{extra}: {}", e.message);
        }
    }

    #[test]
    fn bad_bodies_are_400_with_a_reason() {
        let cases: &[(&[u8], &str)] = &[
            (b"{not json", "not JSON"),
            (b"[1]", "JSON object"),
            (br#"{"messages":[]}"#, "empty"),
            (br#"{"model":"m"}"#, "`messages`"),
            (br#"{"messages":[{"role":"robot","content":"x"}]}"#, "robot"),
            (br#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#, "temperature"),
            (br#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#, "top_p 0 is outside (0, 1]"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stop":["a",""]}"#, "stop_strings[1] is empty"),
            (br#"{"messages":[{"role":"user","content":"x"}],"n":100}"#, "n = 100"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#, "`stream` must be a boolean"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#, "only allowed with stream = true"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":1}}"#, "include_usage"),
            (br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#, "max_tokens"),
            (br#"{"messages":[{"role":"user","content":{"a":1}}]}"#, "content"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logprobs":1}"#, "`logprobs` must be a boolean"),
            (br#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#, "needs logprobs = true"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}"#, "top_logprobs"),
            // What would change the generation and is not done here is refused, not ignored.
            (br#"{"messages":[{"role":"user","content":"x"}],"presence_penalty":0.5}"#, "`presence_penalty` is not supported"),
            (br#"{"messages":[{"role":"user","content":"x"}],"repetition_penalty":1.1}"#, "`repetition_penalty`"),
            (br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":-100}}"#, "`logit_bias`"),
            (br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#, "`tools`"),
            (br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}"#, "`response_format`"),
            (br#"{"messages":[{"role":"user","content":"x"}],"guided_json":{}}"#, "`guided_json`"),
        ];
        for (body, want) in cases {
            let e = parse_chat(body, 16).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(want), "{}: {}", String::from_utf8_lossy(body), e.message);
            assert_eq!(error_body(&e)["error"]["type"], "invalid_request_error");
        }
    }
}
