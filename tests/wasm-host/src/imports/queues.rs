//! Shared queues, as Envoy keeps them: a queue is registered by name from
//! a root context (the same name again: the same queue, its owner the last
//! to register it); an enqueue asks for the owner's `on_queue_ready`,
//! which Envoy posts to the owner's worker and the story plays
//! ([`crate::Plugin::root_wakes`]); a dequeue of an empty queue is `Empty`.

use std::collections::VecDeque;

use wasmtime::{Caller, Linker, Result};

use super::called;
use super::status::{BAD_ARGUMENT, EMPTY, NOT_FOUND, OK};
use crate::memory::{give, read, read_str, write_u32};
use crate::state::{Effect, HostState, Queue};

/// A queue's token: its place in [`HostState::queues`], from 1.
fn queue(state: &mut HostState, token: i32) -> Option<&mut Queue> {
    let at = usize::try_from(token).ok()?.checked_sub(1)?;
    state.queues.get_mut(at)
}

pub(super) fn link(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut caller: Caller<'_, HostState>, name: i32, name_len: i32, token_out: i32| -> Result<i32> {
            if called(&mut caller, "proxy_register_shared_queue") {
                return Ok(BAD_ARGUMENT);
            }
            let name = read_str(&mut caller, name, name_len)?;
            let queues = &mut caller.data_mut().queues;
            let at = match queues.iter().position(|q| q.name == name) {
                Some(at) => at,
                None => {
                    queues.push(Queue { name, items: VecDeque::new() });
                    queues.len() - 1
                }
            };
            write_u32(&mut caller, token_out, at as u32 + 1).map(|()| OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut caller: Caller<'_, HostState>, token: i32, ptr: i32, len: i32| -> Result<i32> {
            if called(&mut caller, "proxy_enqueue_shared_queue") {
                return Ok(BAD_ARGUMENT);
            }
            let value = read(&mut caller, ptr, len)?;
            let state = caller.data_mut();
            let Some(queue) = queue(state, token) else { return Ok(NOT_FOUND) };
            queue.items.push_back(value);
            state.effects.push(Effect::Enqueue(token as u32));
            state.queue_ready.push_back(token as u32);
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut caller: Caller<'_, HostState>, token: i32, ptr_out: i32, len_out: i32| -> Result<i32> {
            if called(&mut caller, "proxy_dequeue_shared_queue") {
                return Ok(BAD_ARGUMENT);
            }
            let Some(queue) = queue(caller.data_mut(), token) else { return Ok(NOT_FOUND) };
            let Some(value) = queue.items.pop_front() else { return Ok(EMPTY) };
            give(&mut caller, &value, ptr_out, len_out).map(|()| OK)
        },
    )?;
    Ok(())
}
