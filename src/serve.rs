//! `kiln serve`: an OpenAI-compatible HTTP server over one loaded model.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions` (both with `"stream": true` as
//! server-sent events), `GET /v1/models`, `GET /health`. The engine decodes one sequence at a
//! time (batch 1), so it lives on the command's own thread and takes requests in arrival order
//! from a queue; the HTTP side runs on a small tokio runtime beside it. Keeping the engine on
//! one thread also keeps its KV cache warm: a chat that resends its history only prefills the
//! new turn. A client that disconnects stops its generation at the next piece of text.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use axum::extract::{State, rejection::JsonRejection};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use kiln_host::backend::Backend;
use kiln_host::chat::Message;
use kiln_host::engine::{Engine, GenParams, Generation, StopReason};
use kiln_host::sampling::SamplerConfig;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::{SampleArgs, encode_prompt, template};

/// What a request asks the engine for: raw text, or chat turns for the model's template.
enum Input {
    Text(String),
    Chat(Vec<Message>),
}

/// One queued request and where its output goes.
struct Job {
    input: Input,
    params: GenParams,
    events: UnboundedSender<Event>,
}

/// What the engine thread sends back for a job: text as it becomes final, then the outcome.
enum Event {
    Piece(String),
    Done(std::result::Result<Generation, String>),
}

/// The error a generation stops with once its client has gone (nothing to report to).
#[derive(Debug)]
struct ClientGone;
impl std::fmt::Display for ClientGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("client disconnected")
    }
}
impl std::error::Error for ClientGone {}

struct Shared {
    jobs: mpsc::Sender<Job>,
    model_id: String,
    defaults: SampleArgs,
    next_id: AtomicU64,
}

/// Serves until the process is stopped: binds `addr`, prints `kiln: listening on http://…` to
/// stderr, then runs the engine loop on this thread.
pub fn serve<B: Backend + 'static>(
    mut engine: Engine<B>,
    addr: &str,
    model_id: String,
    defaults: SampleArgs,
) -> Result<()> {
    let (jobs, queue) = mpsc::channel::<Job>();
    let shared = Arc::new(Shared {
        jobs,
        model_id,
        defaults,
        next_id: AtomicU64::new(1),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(shared);
    rt.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("kiln: server stopped: {e}");
        }
    });
    eprintln!("kiln: listening on http://{local}");
    // The engine loop: requests one at a time, in arrival order.
    for job in queue {
        let outcome = run_job(&mut engine, &job);
        if let Err(e) = &outcome
            && e.downcast_ref::<ClientGone>().is_none()
        {
            eprintln!("kiln: request failed: {e:#}");
        }
        let _ = job
            .events
            .send(Event::Done(outcome.map_err(|e| format!("{e:#}"))));
    }
    Ok(())
}

fn run_job<B: Backend + 'static>(engine: &mut Engine<B>, job: &Job) -> Result<Generation> {
    let text = match &job.input {
        Input::Text(t) => t.clone(),
        Input::Chat(msgs) => template(engine)?.render(msgs, true)?,
    };
    let ids = encode_prompt(&engine.tokenizer, &text)?;
    engine.generate(&ids, &job.params, &mut |piece| {
        job.events
            .send(Event::Piece(piece.to_owned()))
            .map_err(|_| anyhow!(ClientGone))
    })
}

/// The OpenAI request fields kiln reads; others (`user`, `logprobs: false`, ..) are ignored.
#[derive(Deserialize)]
struct Request {
    prompt: Option<Value>,
    messages: Option<Vec<ChatMessage>>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Value>,
    #[serde(default)]
    stream: bool,
    n: Option<usize>,
    #[serde(default)]
    ignore_eos: bool,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Value,
}

/// A request error: HTTP 400 with OpenAI's error body.
struct BadRequest(String);

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.0, "type": "invalid_request_error"}});
        (StatusCode::BAD_REQUEST, Json(body)).into_response()
    }
}

fn server_error(message: String) -> Response {
    let body = json!({"error": {"message": message, "type": "server_error"}});
    (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response()
}

impl Request {
    /// Sampling and length settings: the request's, else the server's command-line defaults.
    fn params(&self, d: &SampleArgs) -> std::result::Result<GenParams, BadRequest> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(BadRequest(format!(
                "n = {n}: kiln returns one choice per request"
            )));
        }
        let stop = match &self.stop {
            None | Some(Value::Null) => d.stop.clone(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|s| s.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| BadRequest("stop: expected a string or strings".into()))?,
            Some(_) => return Err(BadRequest("stop: expected a string or strings".into())),
        };
        let temperature = self.temperature.unwrap_or(d.temp);
        if temperature.is_nan() || temperature < 0.0 {
            return Err(BadRequest(format!(
                "temperature = {temperature}: must be ≥ 0"
            )));
        }
        let top_p = self.top_p.unwrap_or(d.top_p);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(BadRequest(format!("top_p = {top_p}: must be in (0, 1]")));
        }
        let max_tokens = self.max_tokens.or(self.max_completion_tokens);
        if max_tokens == Some(0) {
            return Err(BadRequest("max_tokens = 0: must be at least 1".into()));
        }
        Ok(GenParams {
            max_tokens: max_tokens.unwrap_or(d.n),
            sampler: SamplerConfig {
                temperature,
                top_k: self.top_k.unwrap_or(d.top_k),
                top_p,
                min_p: self.min_p.unwrap_or(d.min_p),
                repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
                seed: self.seed.or(d.seed).unwrap_or_else(clock_seed),
                ..SamplerConfig::default()
            },
            stop,
            ignore_eos: self.ignore_eos || d.ignore_eos,
        })
    }
}

impl Request {
    /// `/v1/completions`' prompt: one string (or a batch of one).
    fn text_input(&self) -> std::result::Result<Input, BadRequest> {
        match &self.prompt {
            Some(Value::String(p)) => Ok(Input::Text(p.clone())),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                Ok(Input::Text(a[0].as_str().unwrap_or_default().to_owned()))
            }
            Some(_) => Err(BadRequest(
                "prompt: expected one string (batches are not supported)".into(),
            )),
            None => Err(BadRequest("prompt: missing".into())),
        }
    }

    /// `/v1/chat/completions`' turns, for the model's chat template.
    fn chat_input(&self) -> std::result::Result<Input, BadRequest> {
        let msgs = match &self.messages {
            Some(m) if !m.is_empty() => m,
            _ => return Err(BadRequest("messages: missing or empty".into())),
        };
        let turns = msgs
            .iter()
            .enumerate()
            .map(|(i, m)| Ok(Message::new(&m.role, message_text(i, &m.content)?)))
            .collect::<std::result::Result<_, BadRequest>>()?;
        Ok(Input::Chat(turns))
    }
}

fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A chat message's text: a string, or OpenAI's array of `{"type": "text", "text": ..}` parts.
fn message_text(i: usize, content: &Value) -> std::result::Result<String, BadRequest> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                (Some("text"), Some(t)) => Ok(t),
                (kind, _) => Err(BadRequest(format!(
                    "messages[{i}].content: part of type {} is not supported (text only)",
                    kind.unwrap_or("(none)")
                ))),
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(|t| t.concat()),
        _ => Err(BadRequest(format!(
            "messages[{i}].content: expected a string or an array of text parts"
        ))),
    }
}

async fn models(State(s): State<Arc<Shared>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": s.model_id, "object": "model", "created": now(), "owned_by": "kiln"}],
    }))
}

async fn completions(
    State(s): State<Arc<Shared>>,
    req: std::result::Result<Json<Request>, JsonRejection>,
) -> Response {
    handle(s, req, Kind::Text).await
}

async fn chat_completions(
    State(s): State<Arc<Shared>>,
    req: std::result::Result<Json<Request>, JsonRejection>,
) -> Response {
    handle(s, req, Kind::Chat).await
}

async fn handle(
    s: Arc<Shared>,
    req: std::result::Result<Json<Request>, JsonRejection>,
    kind: Kind,
) -> Response {
    let req = match req {
        Ok(Json(r)) => r,
        Err(e) => return BadRequest(e.body_text()).into_response(),
    };
    let input = match kind {
        Kind::Text => req.text_input(),
        Kind::Chat => req.chat_input(),
    };
    match input {
        Ok(input) => respond(s, req, input, kind).await,
        Err(e) => e.into_response(),
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Text,
    Chat,
}

/// Queues the job, then answers with one JSON body or, for `stream`, server-sent events.
async fn respond(s: Arc<Shared>, req: Request, input: Input, kind: Kind) -> Response {
    let params = match req.params(&s.defaults) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let (tx, mut rx) = unbounded_channel();
    let job = Job {
        input,
        params,
        events: tx,
    };
    if s.jobs.send(job).is_err() {
        return server_error("the engine has stopped".into());
    }
    let id = format!(
        "{}-{}",
        match kind {
            Kind::Text => "cmpl",
            Kind::Chat => "chatcmpl",
        },
        s.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let head = Head {
        id,
        model: s.model_id.clone(),
        created: now(),
        kind,
    };
    if req.stream {
        let events = UnboundedReceiverStream::new(rx).flat_map(move |ev| {
            futures_util::stream::iter(
                head.sse(ev)
                    .into_iter()
                    .map(Ok::<_, std::convert::Infallible>),
            )
        });
        return Sse::new(events).into_response();
    }
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Piece(p) => text.push_str(&p),
            Event::Done(Ok(g)) => return Json(head.body(&g, text)).into_response(),
            Event::Done(Err(e)) => return BadRequest(e).into_response(),
        }
    }
    server_error("the engine dropped the request".into())
}

/// What every response object of one request repeats.
struct Head {
    id: String,
    model: String,
    created: u64,
    kind: Kind,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Text, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    /// One choice: `text` for completions, a message (or a delta when streaming) for chat.
    fn choice(&self, text: &str, finish: Option<&str>, chunk: bool) -> Value {
        match (self.kind, chunk) {
            (Kind::Text, _) => json!({"index": 0, "text": text, "finish_reason": finish}),
            (Kind::Chat, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }),
            (Kind::Chat, true) => {
                let delta = match finish {
                    Some(_) => json!({}),
                    None => json!({"role": "assistant", "content": text}),
                };
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
        }
    }

    fn envelope(&self, choice: Value, chunk: bool) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    /// The whole answer: text, why it stopped, token counts and kiln's timings.
    fn body(&self, g: &Generation, text: String) -> Value {
        let mut v = self.envelope(
            self.choice(&text, Some(finish_reason(g.stop)), false),
            false,
        );
        v["usage"] = usage(g);
        v["timings"] = json!({
            "prompt_n": g.timings.prefill_tokens,
            "prompt_ms": g.timings.prefill_s * 1e3,
            "predicted_n": g.tokens.len(),
            "predicted_per_second": g.timings.decode_tps(),
        });
        v
    }

    /// The server-sent events for one engine event; the outcome closes the stream with a
    /// final chunk (finish reason and usage) or an error, then `[DONE]`.
    fn sse(&self, ev: Event) -> Vec<SseEvent> {
        let data = |v: Value| SseEvent::default().data(v.to_string());
        match ev {
            Event::Piece(p) => vec![data(self.envelope(self.choice(&p, None, true), true))],
            Event::Done(Ok(g)) => {
                let last = self.choice("", Some(finish_reason(g.stop)), true);
                let mut v = self.envelope(last, true);
                v["usage"] = usage(&g);
                vec![data(v), SseEvent::default().data("[DONE]")]
            }
            Event::Done(Err(e)) => vec![
                data(json!({"error": {"message": e, "type": "server_error"}})),
                SseEvent::default().data("[DONE]"),
            ],
        }
    }
}

fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::Eos | StopReason::StopString => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

fn usage(g: &Generation) -> Value {
    let (p, c) = (g.timings.prompt_tokens, g.tokens.len());
    json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c})
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
