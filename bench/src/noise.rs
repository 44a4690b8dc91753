//! How quiet the machine was: a background sampler that, every few seconds,
//! reads the load average and counts compiler processes (rustc, cc1, ld, ...)
//! that someone else is running. The bench's own builds are over before it
//! starts, so any compiler it sees competes with the measurement.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const EVERY: Duration = Duration::from_secs(2);
const COMPILERS: &[&str] =
    &["rustc", "cc1", "cc1plus", "ld", "lld", "wasm-ld", "clippy-driver", "rust-analyzer"];

#[derive(Clone, Debug, Default)]
pub(crate) struct Noise {
    pub(crate) samples: u32,
    /// Samples in which at least one compiler process ran.
    pub(crate) busy_samples: u32,
    /// The most compiler processes seen at once.
    pub(crate) most_compilers: u32,
    /// The 1-minute load average, at the first sample and at its highest.
    pub(crate) first_load: f64,
    pub(crate) max_load: f64,
}

pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Noise>,
}

impl Sampler {
    pub(crate) fn start() -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut noise = Noise::default();
            while !flag.load(Ordering::SeqCst) {
                let load = load_average();
                let compilers = compilers();
                if noise.samples == 0 {
                    noise.first_load = load;
                }
                noise.samples += 1;
                noise.max_load = noise.max_load.max(load);
                noise.most_compilers = noise.most_compilers.max(compilers);
                noise.busy_samples += u32::from(compilers > 0);
                // Sleep in short steps so stopping is prompt.
                for _ in 0..20 {
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(EVERY / 20);
                }
            }
            noise
        });
        Sampler { stop, thread }
    }

    pub(crate) fn finish(self) -> Noise {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

fn load_average() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(f64::NAN)
}

/// Processes whose name is a compiler or linker.
fn compilers() -> u32 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    let mut n = 0;
    for entry in dir.flatten() {
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
            n += u32::from(COMPILERS.contains(&comm.trim()));
        }
    }
    n
}
