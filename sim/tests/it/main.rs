//! The simulator's integration tests, in one binary (one link instead of seven).

mod adversarial;
mod cancel;
mod capacity;
mod check;
mod cli;
mod conditional;
mod defects;
mod diff;
mod hardening;
mod jobs;
mod kv_decode;
mod kv_routing;
mod model;
mod outputs;
mod overload;
mod pd_prefix;
mod pools;
mod prefix;
mod queueing;
mod replay;
mod schema;
mod scratch;
mod streak;
mod sweep;
mod topology;
mod validation;
