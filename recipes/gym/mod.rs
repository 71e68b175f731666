//! The kernel gym over HTTP, the client side: [`remote::Remote`] is the executor a recipe's
//! `[env] remote = ["http://host:port", …]` sends evaluations through, to `ember gym serve`
//! (`ember_serve::gym`).

pub mod remote;
