//! The integration suite, one binary: each module is one area, with real
//! ferry processes, tools on loopback and, for the cluster, nats-server.
//! One binary links the runtime once; run one area with
//! `cargo test --test integration <module>::`.

mod acp;
mod api_tokens;
mod approvals;
mod audit;
mod callbacks;
mod calls;
mod chaos;
mod choices;
mod cluster;
mod concurrency;
mod connections;
mod consumers;
mod dashboard;
mod data_dir;
mod dispatch;
mod durability;
mod hardening;
mod identities;
mod jwt;
mod limits;
mod mcp;
mod operator;
mod outbound;
mod oxp;
mod streams;
mod tidy;
mod toolsets;
