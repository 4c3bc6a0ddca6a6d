//! `admin`: the ctl.delivery-admin rail as a manager meets it.

super::cases! { "admin":
}
