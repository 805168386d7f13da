//! What sits below a proxy: a local directory or an NFSv3 server.

pub mod dir;
