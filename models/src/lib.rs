//! Sans-IO component models of cancelsim.
//!
//! Every model takes `now` and an input and returns what follows. None of them touches a clock,
//! a queue, a file or a thread, so each is tested alone and can be driven without the engine.

pub mod batcher;
pub mod cleanup;
pub mod engine;
pub mod gpu;
pub mod kv;
pub mod ownership;
pub mod prefix;
pub mod protocol;
pub mod recent;
pub mod replica;
pub mod sparse;
pub mod topology;
pub mod transfer;
