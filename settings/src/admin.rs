//! `admin`: the operator's calls to a running relay, through its admin listener.

use crate::table::View;
use crate::Error;
use relay_core::wire::canonical;
use relay_core::wire::json::Object;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub(crate) struct AdminArgs {
    /// The relay's data directory: holds admin.token, and admin.url (the admin listener's
    /// address, written by the running relay).
    #[arg(long, global = true, default_value = ".relay")]
    data: PathBuf,
    /// The admin listener's URL, instead of the one in DATA/admin.url.
    #[arg(long, global = true, visible_alias = "admin-url")]
    url: Option<String>,
    /// On a relay started with --shards: the shard asked (deliveries and backups are per
    /// shard; shard k's database is relay-shard-k.sqlite, shard 0's relay.sqlite).
    #[arg(long, global = true, default_value_t = 0)]
    shard: u32,
    /// Print the relay's answer as the JSON it wrote, instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    what: AdminCommand,
}

/// One operator call.
#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum AdminCommand {
    /// List deliveries this relay is responsible for (and quarantined tick entries), a
    /// page at a time: the answer's `next`, passed as --after, gives the following page.
    Deliveries {
        /// Only these (default: pending and failed).
        state: Option<DeliveryState>,
        /// Start after this cursor (a previous page's `next`).
        #[arg(long)]
        after: Option<String>,
        /// At most this many (1 to 1000; default 1000).
        #[arg(long)]
        limit: Option<u64>,
    },
    /// List the destinations this relay delivers to, with each one's pending deliveries,
    /// consecutive failures and since when, last success and last error, a page at a time.
    Destinations {
        /// Only destinations whose latest attempt failed.
        #[arg(long)]
        failing: bool,
        /// Only destinations the operator paused.
        #[arg(long)]
        paused: bool,
        /// Start after this destination (a previous page's `next`).
        #[arg(long)]
        after: Option<String>,
        /// At most this many (1 to 1000; default 100).
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Make every delivery to DESTINATION that waits for its next attempt due now (no
    /// earlier than a retry_after it asked for, never after a deadline); up to 1000 a call,
    /// and the answer's `next`, passed as --after, goes on.
    Retry {
        /// The destination relay's id (as `admin destinations` lists it).
        destination: String,
        /// Continue after this delivery (a previous call's `next`).
        #[arg(long)]
        after: Option<String>,
    },
    /// Hold DESTINATION: no attempt starts until `resume` (accepted messages still queue for
    /// it, and each still fails at its deadline). Survives restarts.
    Pause {
        /// The destination relay's id.
        destination: String,
    },
    /// Release a paused DESTINATION: its held deliveries start as slots allow.
    Resume {
        /// The destination relay's id.
        destination: String,
    },
    /// List the entries ticks set aside (quarantined), a page at a time.
    Quarantine {
        /// Start after this id (a previous page's `next`).
        #[arg(long)]
        after: Option<String>,
        /// At most this many (1 to 1000; default 100).
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Forget the quarantined entry ID for good.
    QuarantineDrop {
        /// The entry's id, as `admin quarantine` lists it.
        id: String,
    },
    /// Give the quarantined entry ID back to the tick (after fixing its cause).
    QuarantineRequeue {
        /// The entry's id, as `admin quarantine` lists it.
        id: String,
    },
    /// Make one waiting delivery due now: the message MESSAGE_ID sent by account FROM.
    RetryDelivery {
        /// The sender's account id.
        from: String,
        /// The message's id.
        message_id: String,
    },
    /// Copy the running relay's database to FILE, consistently, without stopping it.
    ///
    /// The relay writes the copy itself (SQLite's online backup over its own connection,
    /// between two commit groups), so FILE holds exactly the operations committed before
    /// the backup began. FILE is written whole with mode 0600 and replaces any file there;
    /// it is a path on the relay's machine.
    ///
    /// To restore: stop the relay; make a new data directory holding FILE as relay.sqlite
    /// and the original relay.key (and admin.token, to keep the operator token); start the
    /// relay on it with the same --url. Deliveries pending in the backup resume. Messages
    /// accepted after the backup began are not in it: clients retry them unchanged, and
    /// the protocol's idempotency makes the retry safe.
    Backup {
        /// Where to write the copy.
        file: PathBuf,
    },
    /// Print the relay's metrics (the Prometheus text of GET /metrics).
    Metrics,
}

/// Which deliveries `admin deliveries` lists.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Still being attempted.
    Pending,
    /// Ended without delivery.
    Failed,
}

/// An `admin` command line: where the relay is, and what to ask it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// The relay's data directory.
    pub data: PathBuf,
    /// The admin listener's URL when given (else DATA/admin.url names it).
    pub url: Option<String>,
    /// The shard asked.
    pub shard: u32,
    /// Print the answer as JSON (`--json`), not as a table.
    pub json: bool,
    /// The call.
    pub what: AdminCommand,
}

impl From<AdminArgs> for Admin {
    fn from(a: AdminArgs) -> Admin {
        Admin {
            data: a.data,
            url: a.url,
            shard: a.shard,
            json: a.json,
            what: a.what,
        }
    }
}

/// The HTTP request an admin command makes; the host sends it and prints the answer's body
/// (to stdout on 200, else with its status to stderr, exiting 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminCall {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// The whole URL.
    pub url: String,
    /// The operator's bearer token, for `authorization` (none for `/metrics`).
    pub authorization: Option<String>,
    /// The canonical JSON body of a `POST`.
    pub body: Vec<u8>,
    /// How to print a 200 answer ([`crate::render`]).
    pub view: View,
}

impl Admin {
    /// How this command's answer is printed: a table for a listing, a line for an action,
    /// as it came for metrics or under `--json`.
    pub fn view(&self) -> View {
        if self.json {
            return View::Raw;
        }
        match self.what {
            AdminCommand::Deliveries { .. } => View::Deliveries,
            AdminCommand::Destinations { .. } => View::Destinations,
            AdminCommand::Quarantine { .. } => View::Quarantine,
            AdminCommand::Metrics => View::Raw,
            _ => View::Action,
        }
    }

    /// The request to make. `read` reads the relay's files (admin.url, admin.token); `cwd`
    /// makes a backup's file absolute, since the relay, not this process, writes it.
    pub fn call(
        &self,
        mut read: impl FnMut(&Path) -> Result<String, String>,
        cwd: &Path,
    ) -> Result<AdminCall, Error> {
        let base = match &self.url {
            Some(u) => u.clone(),
            None => {
                let file = self.data.join("admin.url");
                read(&file).map_err(|e| {
                    Error(format!(
                        "{}: {e} (is a relay running on this data directory? or pass --url)",
                        file.display()
                    ))
                })?
            }
        };
        let base = base.trim().trim_end_matches('/');
        let mut params = Object::new();
        let method = match &self.what {
            AdminCommand::Metrics => {
                return Ok(AdminCall {
                    method: "GET",
                    url: format!("{base}/metrics"),
                    authorization: None,
                    body: Vec::new(),
                    view: View::Raw,
                })
            }
            AdminCommand::Deliveries {
                state,
                after,
                limit,
            } => {
                page(&mut params, after, *limit);
                if let Some(s) = state {
                    params.insert(
                        "state",
                        match s {
                            DeliveryState::Pending => "pending",
                            DeliveryState::Failed => "failed",
                        },
                    );
                }
                "deliveries"
            }
            AdminCommand::Destinations {
                failing,
                paused,
                after,
                limit,
            } => {
                page(&mut params, after, *limit);
                if *failing {
                    params.insert("failing", true);
                }
                if *paused {
                    params.insert("paused", true);
                }
                "destinations"
            }
            AdminCommand::Quarantine { after, limit } => {
                page(&mut params, after, *limit);
                "quarantine"
            }
            AdminCommand::QuarantineDrop { id } => {
                params.insert("id", id.as_str());
                "quarantine.drop"
            }
            AdminCommand::QuarantineRequeue { id } => {
                params.insert("id", id.as_str());
                "quarantine.requeue"
            }
            AdminCommand::Pause { destination } => {
                params.insert("destination", destination.as_str());
                "destination.pause"
            }
            AdminCommand::Resume { destination } => {
                params.insert("destination", destination.as_str());
                "destination.resume"
            }
            AdminCommand::Retry { destination, after } => {
                params.insert("destination", destination.as_str());
                page(&mut params, after, None);
                "destination.retry"
            }
            AdminCommand::RetryDelivery { from, message_id } => {
                params.insert("from", from.as_str());
                params.insert("message_id", message_id.as_str());
                "delivery.retry"
            }
            AdminCommand::Backup { file } => {
                params.insert("path", cwd.join(file).display().to_string());
                "backup"
            }
        };
        let token_file = self.data.join("admin.token");
        let token =
            read(&token_file).map_err(|e| Error(format!("{}: {e}", token_file.display())))?;
        Ok(AdminCall {
            method: "POST",
            url: format!("{base}/admin/v1/{method}?shard={}", self.shard),
            authorization: Some(format!("Bearer {}", token.trim())),
            body: canonical::object_to_vec(&params),
            view: self.view(),
        })
    }
}

/// A listing's page parameters, when given.
fn page(params: &mut Object, after: &Option<String>, limit: Option<u64>) {
    if let Some(a) = after {
        params.insert("after", a.as_str());
    }
    if let Some(n) = limit {
        params.insert("limit", n);
    }
}
