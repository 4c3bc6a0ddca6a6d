pub mod provision;
pub mod wire;
