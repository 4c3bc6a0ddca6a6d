//! Credential renewal: the 75 % re-read, `reloadCreds` adoption, the renewal owner's re-sign.

mod creds;
mod late;
mod remint;
mod retry;
mod sighup;
