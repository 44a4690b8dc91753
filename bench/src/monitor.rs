//! What clients send Redis, seen with `redis-cli MONITOR`: the commands that
//! arrive from connections (not the ones a script runs inside Redis) while a
//! closure runs. MONITOR slows Redis down, so it only watches small, counted
//! samples, never a timed run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// How long to wait for MONITOR to start, and for the last lines to arrive.
const SETTLE: Duration = Duration::from_millis(300);

/// The client commands (each as its arguments) Redis received while `during` ran.
pub(crate) fn client_commands(
    redis_cli: &Path,
    port: u16,
    during: impl FnOnce() -> Result<()>,
) -> Result<Vec<Vec<String>>> {
    let mut child = Command::new(redis_cli)
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "monitor"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-cli monitor")?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let (lines, received) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    // redis-cli prints OK once MONITOR is on; nothing before it is seen.
    let started = received.recv_timeout(Duration::from_secs(5));
    let outcome = match started {
        Ok(line) if line.trim() == "OK" => during(),
        Ok(line) => Err(anyhow::anyhow!("redis-cli monitor said {line:?}")),
        Err(_) => Err(anyhow::anyhow!("redis-cli monitor did not start")),
    };
    std::thread::sleep(SETTLE);
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    outcome?;
    let mut commands = Vec::new();
    for line in received.try_iter() {
        if let Some(args) = client_command(&line) {
            commands.push(args);
        }
    }
    Ok(commands)
}

/// `1700000000.123456 [0 127.0.0.1:40000] "EVALSHA" "ab" ...` to its
/// arguments; `None` for a command a script ran (`[0 lua]`).
fn client_command(line: &str) -> Option<Vec<String>> {
    let (source, rest) = line.split_once('[')?.1.split_once("] ")?;
    if source.ends_with(" lua") {
        return None;
    }
    unquote_all(rest).ok()
}

/// MONITOR's arguments: double-quoted, with `\"`, `\\`, `\n`, `\r`, `\t` and
/// `\xNN` escapes.
fn unquote_all(mut s: &str) -> Result<Vec<String>> {
    let mut args = Vec::new();
    while let Some(start) = s.find('"') {
        let mut arg = Vec::new();
        let mut bytes = s[start + 1..].bytes().enumerate();
        let end = loop {
            let Some((i, b)) = bytes.next() else { bail!("unterminated argument in {s:?}") };
            match b {
                b'"' => break i,
                b'\\' => match bytes.next().map(|(_, e)| e) {
                    Some(b'n') => arg.push(b'\n'),
                    Some(b'r') => arg.push(b'\r'),
                    Some(b't') => arg.push(b'\t'),
                    Some(b'x') => {
                        let hex: Vec<u8> = bytes.by_ref().take(2).map(|(_, h)| h).collect();
                        let hex = std::str::from_utf8(&hex)?;
                        arg.push(u8::from_str_radix(hex, 16)?);
                    }
                    Some(other) => arg.push(other),
                    None => bail!("dangling escape in {s:?}"),
                },
                _ => arg.push(b),
            }
        };
        args.push(String::from_utf8_lossy(&arg).into_owned());
        s = &s[start + 1 + end + 1..];
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's command keeps its arguments, escapes and empty strings; a
    /// script's own calls are not client commands.
    #[test]
    fn monitor_lines() {
        let line = r#"1700000000.1 [0 127.0.0.1:4000] "EVALSHA" "ab" "1" "k{x}" "" "a\"b\x41""#;
        assert_eq!(client_command(line).unwrap(), ["EVALSHA", "ab", "1", "k{x}", "", "a\"bA"]);
        assert_eq!(client_command(r#"1700000000.1 [0 lua] "ZCARD" "k""#), None);
    }
}
