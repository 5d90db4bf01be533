//! Correlate: turns decoded traffic into routing facts and checks the two routing paths
//! against each other.

pub mod routes;
