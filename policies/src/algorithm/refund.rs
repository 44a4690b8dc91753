//! `refund`: twin of `lua/scripts/refund.lua` for a bucket (`gcra`): a
//! Redis Cluster's charge-then-refund, when another slot denied the request
//! whose charge this slot had made. The bucket's `tat` goes back by the
//! charge, and the refund is logged with where the charge ended
//! ([`super::settle`]), as a settlement's refund is: a later settlement of
//! another charge then knows this refund was of a charge after its own (it
//! moved nothing of it) or before. Unlogged, it counted as one before, and
//! a settlement whose charge was near its end could give back nothing of
//! its unused part. (The script's other branches, for windows, logs and
//! concurrency, are modelled with their kinds; calendar counters in
//! [`super::calendar::refund`].)

use super::{refunded, refunded_key, settle, RedisTwin, State};

/// A bucket's charge as its check reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub key: String,
    /// The bucket's time per unit.
    pub interval_us: u64,
    /// The units charged.
    pub cost: u64,
    /// The check's `held_until_us` (0: unknown, the refund is not logged)
    /// and `refunded_us`.
    pub held_until_us: u64,
    pub refunded_us: u64,
}

/// Takes back `charge`: its bucket's `tat` goes back by the charge, the
/// refund counter on, and (its end known) the refund is logged.
pub fn bucket(store: &mut RedisTwin, charge: &Charge) {
    let Some(&State::Tat(tat)) = store.keys.get(&charge.key) else { return };
    let shift = charge.cost.saturating_mul(charge.interval_us);
    store.keys.insert(charge.key.clone(), State::Tat(tat.saturating_sub(shift)));
    let counter = refunded(store, &charge.key);
    if charge.held_until_us > 0 && counter >= charge.refunded_us {
        let end = settle::charge_end(
            settle::log(store, &charge.key),
            charge.held_until_us,
            charge.refunded_us,
            counter,
        );
        settle::log_refund(store, &charge.key, counter, end, shift);
    }
    store.keys.insert(refunded_key(&charge.key), State::Refunded(counter + shift));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Charges A [0, 10] and B [10, 20]; B is refunded on its Cluster slot,
    /// then A settles: A's end is still 10, so A may give back all of its
    /// unused part. Before, B's refund went unlogged and counted as one
    /// before A: A's end was taken as 0, and A gave back nothing.
    #[test]
    fn a_refund_of_a_later_charge_leaves_an_earlier_one_its_end() {
        let mut store = RedisTwin::default();
        store.keys.insert("k".into(), State::Tat(20));
        let b = Charge { key: "k".into(), interval_us: 1, cost: 10, held_until_us: 20, refunded_us: 0 };
        bucket(&mut store, &b);
        assert_eq!(store.keys.get("k"), Some(&State::Tat(10)));
        let counter = refunded(&store, "k");
        assert_eq!(counter, 10);
        assert_eq!(settle::charge_end(settle::log(&store, "k"), 10, 0, counter), 10, "A ends where it did");
    }
}
