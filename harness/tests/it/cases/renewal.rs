//! `renewal`: credential renewal: the 75 % re-read, missed remints, expiry, reloadCreds, rogue re-signs.

super::cases! { "renewal":
}
