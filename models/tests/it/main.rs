//! The models' integration tests, in one binary (one link instead of three).

mod coast;
mod driver;
mod engine;
mod engine_pin;
mod engine_queue;
mod prefix;
mod properties;
mod reference;
mod streak;
mod streak_times;
