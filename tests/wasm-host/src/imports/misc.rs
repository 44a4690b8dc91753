//! The rest of the host calls the filter makes: logging, the clock and the
//! tick, properties, the effective context, shared data and metrics.
//!
//! The clock is the host's fake clock, so time moves only when the story says.

use wasmtime::{Caller, Linker, Result};

use super::called;
use super::status::{BAD_ARGUMENT, CAS_MISMATCH, NOT_FOUND, OK};
use crate::memory::{give, read, read_str, write_u32, write_u64};
use crate::metrics::{MetricError, MetricType};
use crate::properties;
use crate::shared_data::SetResult;
use crate::state::{Effect, HostState, LogLevel, MetricChange};

fn metric_status(result: std::result::Result<(), MetricError>) -> i32 {
    match result {
        Ok(()) => OK,
        Err(MetricError::NotFound) => NOT_FOUND,
        Err(MetricError::BadArgument) => BAD_ARGUMENT,
    }
}

pub(super) fn link(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap(
        "env",
        "proxy_log",
        |mut caller: Caller<'_, HostState>, level: i32, ptr: i32, len: i32| -> Result<i32> {
            called(&mut caller, "proxy_log");
            let message = read_str(&mut caller, ptr, len)?;
            caller.data_mut().log(LogLevel::from_abi(level), message);
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut caller: Caller<'_, HostState>, out: i32| -> Result<i32> {
            called(&mut caller, "proxy_get_log_level");
            write_u32(&mut caller, out, 0).map(|()| OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut caller: Caller<'_, HostState>, out: i32| -> Result<i32> {
            called(&mut caller, "proxy_get_current_time_nanoseconds");
            let now = caller.data().now_ns;
            write_u64(&mut caller, out, now).map(|()| OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut caller: Caller<'_, HostState>, ms: i32| -> Result<i32> {
            called(&mut caller, "proxy_set_tick_period_milliseconds");
            caller.data_mut().tick_period_ms = ms as u32;
            Ok(OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut caller: Caller<'_, HostState>, id: i32| -> Result<i32> {
            called(&mut caller, "proxy_set_effective_context");
            let state = caller.data_mut();
            let id = id as u32;
            if id != state.root_context && !state.streams.contains_key(&id) {
                return Ok(BAD_ARGUMENT);
            }
            state.effective = id;
            Ok(OK)
        },
    )?;
    linker.func_wrap("env", "proxy_done", |mut caller: Caller<'_, HostState>| -> Result<i32> {
        called(&mut caller, "proxy_done");
        Ok(OK)
    })?;
    linker.func_wrap(
        "env",
        "proxy_get_property",
        |mut caller: Caller<'_, HostState>,
         path: i32,
         path_len: i32,
         ptr_out: i32,
         len_out: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_get_property");
            let path = read(&mut caller, path, path_len)?;
            match properties::get(caller.data(), &path) {
                Some(value) => give(&mut caller, &value, ptr_out, len_out).map(|()| OK),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_property",
        |mut caller: Caller<'_, HostState>,
         path: i32,
         path_len: i32,
         value: i32,
         value_len: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_set_property");
            let path = read(&mut caller, path, path_len)?;
            let value = read(&mut caller, value, value_len)?;
            Ok(if properties::set(caller.data_mut(), &path, value) { OK } else { BAD_ARGUMENT })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut caller: Caller<'_, HostState>,
         key: i32,
         key_len: i32,
         ptr_out: i32,
         len_out: i32,
         cas_out: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_get_shared_data");
            let key = read_str(&mut caller, key, key_len)?;
            let entry = {
                let shared = caller
                    .data()
                    .shared
                    .lock()
                    .map_err(|_| wasmtime::format_err!("shared data lock poisoned"))?;
                shared.get(&key).map(|(value, cas)| (value.to_vec(), cas))
            };
            let Some((value, cas)) = entry else { return Ok(NOT_FOUND) };
            give(&mut caller, &value, ptr_out, len_out)?;
            write_u32(&mut caller, cas_out, cas).map(|()| OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut caller: Caller<'_, HostState>,
         key: i32,
         key_len: i32,
         value: i32,
         value_len: i32,
         cas: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_set_shared_data");
            let key = read_str(&mut caller, key, key_len)?;
            let value = read(&mut caller, value, value_len)?;
            let mut shared = caller
                .data()
                .shared
                .lock()
                .map_err(|_| wasmtime::format_err!("shared data lock poisoned"))?;
            Ok(match shared.set(&key, &value, cas as u32) {
                SetResult::Ok => OK,
                SetResult::CasMismatch => CAS_MISMATCH,
            })
        },
    )?;
    link_metrics(linker)
}

fn link_metrics(linker: &mut Linker<HostState>) -> Result<()> {
    linker.func_wrap(
        "env",
        "proxy_define_metric",
        |mut caller: Caller<'_, HostState>,
         kind: i32,
         name: i32,
         name_len: i32,
         id_out: i32|
         -> Result<i32> {
            called(&mut caller, "proxy_define_metric");
            let name = read_str(&mut caller, name, name_len)?;
            let Some(kind) = MetricType::from_abi(kind) else { return Ok(BAD_ARGUMENT) };
            let id = caller.data_mut().metrics.define(kind, &name);
            write_u32(&mut caller, id_out, id).map(|()| OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut caller: Caller<'_, HostState>, id: i32, offset: i64| -> Result<i32> {
            called(&mut caller, "proxy_increment_metric");
            let state = caller.data_mut();
            let result = state.metrics.increment(id as u32, offset);
            if let (Ok(()), Some(name)) = (result, state.metrics.name(id as u32)) {
                state.effect(Effect::Metric { name, change: MetricChange::Increment(offset) });
            }
            Ok(metric_status(result))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |mut caller: Caller<'_, HostState>, id: i32, value: i64| -> Result<i32> {
            called(&mut caller, "proxy_record_metric");
            let state = caller.data_mut();
            let result = state.metrics.record(id as u32, value as u64);
            if let (Ok(()), Some(name)) = (result, state.metrics.name(id as u32)) {
                state.effect(Effect::Metric { name, change: MetricChange::Record(value as u64) });
            }
            Ok(metric_status(result))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut caller: Caller<'_, HostState>, id: i32, out: i32| -> Result<i32> {
            called(&mut caller, "proxy_get_metric");
            match caller.data().metrics.get(id as u32) {
                Ok(value) => write_u64(&mut caller, out, value).map(|()| OK),
                Err(err) => Ok(metric_status(Err(err))),
            }
        },
    )?;
    Ok(())
}
