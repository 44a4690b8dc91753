//! Models of the RLS face's peers, for the differential tests.

pub mod limitador;
pub mod ratelimit;
