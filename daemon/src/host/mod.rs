//! The host ring: processes that serve several space daemons (the multi-space host and its
//! lanes, standby hosts). Empty until the multi-space host lands; it will use `space/` and the
//! rings below it, and be used only by the command line.
