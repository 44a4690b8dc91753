-- requires: fixed_window, sliding_window, gcra, pause, rate
-- slots: the earliest slot at which every time-based limit of a request
-- admits it, and its charge there. Twin of policies/src/algorithm/reserve.rs,
-- reserve(). Used by the waiting path of check.lua (reserve.lua) and by the
-- queue's hand-over (queue.lua), which re-checks a waiter's time limits.
--
-- specs[i] = {key, kind, a, b, c, margin}, scaled first by what the
-- partner's refusals taught (rate.lua). Each limit names the earliest
-- time at or after now at which it admits the request; past that time it
-- keeps admitting it (reservations on a key keep arrival order). The slot is
-- the latest of these. If slot - now <= wait every limit is charged at the
-- slot: sent at once if the slot is now (unless hold), else held until the request
-- confirms its send (confirm_slots) or gives it back (cancel_slots).
-- Returns {allowed, at (-1: never), found, committed}: committed[i] =
-- {view, held_until, refunded} when allowed.
local function reserve_slots(now, id, wait, specs, hold)
  apply_rates(specs, now)
  local found = {}
  local at, never = now, false
  for i, s in ipairs(specs) do
    local f
    if s.kind == 'fixed_window' then
      f = fixed_window_reserve(s.key, now, s.a, s.b, s.margin)
    elseif s.kind == 'sliding_window' then
      f = sliding_window_reserve(s.key, now, id, s.a, s.b, s.margin)
    elseif s.kind == 'gcra' then
      f = gcra_reserve(s.key, now, id, s.a, s.b, s.c, s.margin, now + wait, hold)
    elseif s.kind == 'pause' then
      f = pause_reserve(s.key, now)
    elseif s.kind == 'rate' then
      f = rate_reserve(s.key, now)
    else
      return nil, 'cannot wait on ' .. tostring(s.kind)
    end
    found[i] = f
    if f.at < 0 then never = true elseif f.at > at then at = f.at end
  end
  local allowed = (not never) and at - now <= wait
  local committed = {}
  if allowed then
    for i, f in ipairs(found) do
      local view, held, refunded = f.commit(at)
      committed[i] = {view, held or 0, refunded or 0}
    end
  end
  if never then at = -1 end
  return {allowed = allowed, at = at, found = found, committed = committed}
end

-- A held request at its slot (confirm.lua), reserved at `at`: when every
-- limit lets it be sent, against what was really sent meanwhile. Returns
-- {gone, due, found}: gone when a limit no longer holds it; due the time
-- it may be sent (at or before now: now); found[i].commit records the send.
local function confirm_slots(now, id, at, specs)
  apply_rates(specs, now)
  local found, due, gone = {}, now, false
  for _, s in ipairs(specs) do
    local f, held = nil, true
    if s.kind == 'fixed_window' then
      f = fixed_window_confirm(s.key, now, at, s.a, s.b, s.margin)
    elseif s.kind == 'sliding_window' then
      f = sliding_window_confirm(s.key, now, id, s.a, s.b, s.margin)
    elseif s.kind == 'gcra' then
      f = gcra_confirm(s.key, now, id)
    else
      held = false
    end
    if f then
      found[#found + 1] = f
      if f.due > due then due = f.due end
    elseif held then
      gone = true
    end
  end
  return {gone = gone, due = due, found = found}
end

-- Gives back a held reservation of request id at `at`: it was never sent.
local function cancel_slots(now, id, at, specs)
  for _, s in ipairs(specs) do
    if s.kind == 'sliding_window' then
      sliding_window_cancel(s.key, now, id)
    elseif s.kind == 'fixed_window' then
      fixed_window_cancel(s.key, now, at, s.b)
    elseif s.kind == 'gcra' then
      gcra_cancel(s.key, now, id)
    end
  end
end

-- The specs a shim stored for a waiter, "key kind a b c margin ..." (keys
-- never hold spaces: the shim refuses them).
local function parse_specs(text)
  local words = {}
  for w in string.gmatch(text, '%S+') do words[#words + 1] = w end
  local specs = {}
  for i = 1, #words - 5, 6 do
    specs[#specs + 1] = {
      key = words[i], kind = words[i + 1], a = tonumber(words[i + 2]), b = tonumber(words[i + 3]),
      c = tonumber(words[i + 4]), margin = tonumber(words[i + 5]),
    }
  end
  return specs
end
