//! `standby`: standby hosts: kill, return and graceful stop, timed against the lease row's expiry or release.

super::cases! { "standby":
}
