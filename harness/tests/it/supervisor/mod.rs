//! `up` and `down`: the supervisor, foreground and detached.

mod down;
mod holder;
mod log;
mod noop;
mod renewal;
mod up;
