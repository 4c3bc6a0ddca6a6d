//! `up` and `down`: the supervisor, foreground and detached.

mod down;
mod holder;
mod log;
mod renewal;
mod up;
