//! The guest's linear memory, seen from a host call: reading the guest's
//! arguments, writing its out-parameters, and handing it bytes it then owns.
//!
//! Bytes go to the guest the way Envoy sends them: the host asks the guest for
//! a buffer with `proxy_on_memory_allocate`, copies into it, and writes the
//! pointer and length to the guest's out-parameters. Empty data is a null
//! pointer and a zero length (Envoy allocates nothing for it), which the SDK
//! reads as "no value".
//!
//! A guest pointer that falls outside its memory is a guest bug: it traps.

use wasmtime::{bail, Caller, Extern, Memory, Result};

use super::state::HostState;

fn memory(caller: &mut Caller<'_, HostState>) -> Result<Memory> {
    match caller.get_export("memory") {
        Some(Extern::Memory(memory)) => Ok(memory),
        _ => bail!("sluice.wasm exports no `memory`"),
    }
}

fn range(ptr: i32, len: i32) -> Result<std::ops::Range<usize>> {
    let (Ok(start), Ok(len)) = (usize::try_from(ptr as u32), usize::try_from(len as u32)) else {
        bail!("guest pointer {ptr} or length {len} does not fit in usize");
    };
    match start.checked_add(len) {
        Some(end) => Ok(start..end),
        None => bail!("guest range {ptr}+{len} overflows"),
    }
}

/// Copies `len` bytes at `ptr` out of the guest.
pub(crate) fn read(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> Result<Vec<u8>> {
    let memory = memory(caller)?;
    let range = range(ptr, len)?;
    let bytes = match memory.data(&*caller).get(range.clone()) {
        Some(bytes) => bytes.to_vec(),
        None => bail!("guest passed {range:?}, outside its memory"),
    };
    caller.data_mut().costs.bytes_in += bytes.len() as u64;
    Ok(bytes)
}

/// Reads a UTF-8 string argument; invalid UTF-8 is read lossily.
pub(crate) fn read_str(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> Result<String> {
    Ok(String::from_utf8_lossy(&read(caller, ptr, len)?).into_owned())
}

/// Writes `bytes` at `ptr` in the guest.
pub(crate) fn write(caller: &mut Caller<'_, HostState>, ptr: i32, bytes: &[u8]) -> Result<()> {
    let memory = memory(caller)?;
    if let Err(err) = memory.write(&mut *caller, range(ptr, 0)?.start, bytes) {
        bail!("guest out-parameter at {ptr} is outside its memory: {err}");
    }
    Ok(())
}

pub(crate) fn write_u32(caller: &mut Caller<'_, HostState>, ptr: i32, value: u32) -> Result<()> {
    write(caller, ptr, &value.to_le_bytes())
}

pub(crate) fn write_u64(caller: &mut Caller<'_, HostState>, ptr: i32, value: u64) -> Result<()> {
    write(caller, ptr, &value.to_le_bytes())
}

/// Hands `bytes` to the guest: allocates with `proxy_on_memory_allocate`,
/// copies, and writes the pointer to `ptr_out` and the length to `len_out`.
pub(crate) fn give(
    caller: &mut Caller<'_, HostState>,
    bytes: &[u8],
    ptr_out: i32,
    len_out: i32,
) -> Result<()> {
    let Ok(len) = i32::try_from(bytes.len()) else {
        bail!("{} bytes do not fit in the guest", bytes.len());
    };
    let mut ptr = 0;
    if len > 0 {
        let alloc = match caller.get_export("proxy_on_memory_allocate") {
            Some(Extern::Func(f)) => f.typed::<i32, i32>(&*caller)?,
            _ => bail!("sluice.wasm exports no `proxy_on_memory_allocate(i32) -> i32`"),
        };
        ptr = alloc.call(&mut *caller, len)?;
        if ptr == 0 {
            bail!("proxy_on_memory_allocate({len}) returned null");
        }
        write(caller, ptr, bytes)?;
        let costs = &mut caller.data_mut().costs;
        costs.allocations += 1;
        costs.bytes_out += bytes.len() as u64;
    }
    write_u32(caller, ptr_out, ptr as u32)?;
    write_u32(caller, len_out, len as u32)
}
