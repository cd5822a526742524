//! Device memory as `nvidia-smi` sees it: the only view that covers another process, so it is
//! how the protocol measures llama-bench's VRAM (kiln's own figure comes from the driver inside
//! its process). Device `0`: the one `bench model` runs kiln on.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

const MIB: u64 = 1 << 20;

fn query() -> Command {
    let mut c = Command::new("nvidia-smi");
    c.args([
        "--query-gpu=memory.used",
        "--format=csv,noheader,nounits",
        "-i",
        "0",
    ]);
    c
}

/// Device 0's used memory in bytes now; `None` where nvidia-smi cannot tell.
pub fn used_now() -> Option<u64> {
    let out = query().output().ok().filter(|o| o.status.success())?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<u64>()
        .ok()
        .map(|mib| mib * MIB)
}

/// Samples device 0's used memory every 20 ms until stopped.
pub struct Sampler {
    child: Child,
    reader: JoinHandle<Option<u64>>,
}

impl Sampler {
    pub fn start() -> Option<Sampler> {
        let mut child = query()
            .args(["-lms", "20"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let out = child.stdout.take()?;
        let reader = std::thread::spawn(move || {
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| l.trim().parse::<u64>().ok())
                .max()
                .map(|m| m * MIB)
        });
        Some(Sampler { child, reader })
    }

    /// The largest sample, in bytes.
    pub fn stop(mut self) -> Option<u64> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reader.join().ok().flatten()
    }
}
