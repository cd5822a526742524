//! `kiln serve` end to end on the real SmolLM2 file, CPU backend: the server's greedy text is
//! `kiln generate`'s, streamed or not; chat goes through the template; bad requests get a 400
//! naming the field. The server is the built binary on a free port; requests are plain
//! HTTP/1.1 over a socket. Skipped, with a message, when `models/` lacks the file.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

fn model_path() -> Option<PathBuf> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} not found (run scripts/fetch-model.sh)",
            p.display()
        );
        None
    }
}

/// A running `kiln serve`, killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(model: &PathBuf) -> Server {
    let mut child = Command::new(KILN)
        .args(["serve", "--device", "cpu", "--port", "0", "-t", "2", "-m"])
        .arg(model)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning kiln serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("kiln serve exited before listening")
            .unwrap();
        if let Some(a) = line.strip_prefix("kiln: listening on http://") {
            break a.to_owned();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Server { child, addr }
}

/// One request; returns the status code and the body (chunked transfer decoded).
fn request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, mut rest) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (status, rest.to_owned());
    }
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return (status, body);
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = request(addr, "POST", path, &body.to_string());
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

/// The `data:` payloads of a server-sent event stream.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_owned)
        .collect()
}

fn cli_greedy(model: &PathBuf, prompt: &str, n: usize) -> Value {
    let out = Command::new(KILN)
        .args([
            "generate", "--device", "cpu", "-t", "2", "--temp", "0", "--json", "-n",
        ])
        .arg(n.to_string())
        .args(["-p", prompt, "-m"])
        .arg(model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn serve_matches_generate_and_rejects_bad_requests() {
    let Some(model) = model_path() else { return };
    let server = start(&model);
    let a = &server.addr;

    let (status, health) = request(a, "GET", "/health", "");
    assert_eq!((status, health.contains("ok")), (200, true), "{health}");
    let (status, models) = request(a, "GET", "/v1/models", "");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");

    // Greedy completion: the same text and token count as `kiln generate`.
    let prompt = "The capital of France is";
    let cli = cli_greedy(&model, prompt, 24);
    let req = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0});
    let (status, v) = post(a, "/v1/completions", &req);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], cli["completion"], "{v}");
    let n_cli = cli["tokens"].as_array().unwrap().len();
    assert_eq!(v["usage"]["completion_tokens"], n_cli);
    assert_eq!(
        v["usage"]["prompt_tokens"],
        cli["prompt_tokens"].as_array().unwrap().len()
    );
    let finish = if n_cli == 24 { "length" } else { "stop" };
    assert_eq!(v["choices"][0]["finish_reason"], finish);

    // Streamed: the pieces add up to the same text, then a finish chunk and [DONE].
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let (status, body) = request(a, "POST", "/v1/completions", &sreq.to_string());
    assert_eq!(status, 200);
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, cli["completion"].as_str().unwrap());
    assert!(chunks.len() > 2, "streamed as one piece: {body}");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        finish
    );

    // A stop string cuts the text before it.
    let full = cli["completion"].as_str().unwrap();
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[chars.len() / 2..][..3.min(chars.len() / 2)]
        .iter()
        .collect();
    assert!(!stop.is_empty(), "completion too short: {full:?}");
    let mut stop_req = req.clone();
    stop_req["stop"] = json!([stop]);
    let (_, v) = post(a, "/v1/completions", &stop_req);
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let expect = &full[..full.find(&stop).unwrap()];
    assert_eq!(v["choices"][0]["text"], expect, "stop {stop:?}");

    // Chat: the template's prompt, an assistant message, streamed deltas equal to it.
    let chat = json!({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}],
        "max_tokens": 16, "temperature": 0,
    });
    let (status, v) = post(a, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{v}");
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(!answer.trim().is_empty(), "{v}");
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() > 10,
        "no template? {v}"
    );
    let mut schat = chat.clone();
    schat["stream"] = json!(true);
    let (_, body) = request(a, "POST", "/v1/chat/completions", &schat.to_string());
    let streamed: String = sse_data(&body)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(streamed, answer);

    // Bad requests: 400, OpenAI's error body, the field named.
    let bad = [
        ("/v1/completions", json!({"max_tokens": 4}), "prompt"),
        ("/v1/completions", json!({"prompt": 7}), "prompt"),
        ("/v1/completions", json!({"prompt": "x", "n": 3}), "n = 3"),
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": -1}),
            "temperature",
        ),
        ("/v1/completions", json!({"prompt": "x", "stop": 5}), "stop"),
        ("/v1/chat/completions", json!({"messages": []}), "messages"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
        ),
    ];
    for (path, body, field) in bad {
        let (status, v) = post(a, path, &body);
        assert_eq!(status, 400, "{body} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(field), "{body} -> {msg}");
    }
    let (status, text) = request(a, "POST", "/v1/completions", "{not json");
    assert_eq!(status, 400, "{text}");
    // More positions than the model's context: the engine's error, and the server lives on.
    let long = "word ".repeat(9000);
    let (status, v) = post(
        a,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 4}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("context"),
        "{v}"
    );
    let (status, v) = post(a, "/v1/completions", &req);
    assert_eq!(
        (status, &v["choices"][0]["text"]),
        (200, &cli["completion"])
    );
}
