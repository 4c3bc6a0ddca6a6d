//! `up` and `down`: the supervisor, foreground and detached.

mod down;
mod log;
mod up;
