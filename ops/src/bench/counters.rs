//! The machine's counters around a measured window: CPU time (`/proc/*/stat`),
//! TCP retransmissions (`/proc/net`) and a `nats-server`'s message counts.

use std::time::Duration;

use serde_json::Value;

/// The machine's counters: read at an edge of a measured window, so far;
/// as a difference of two readings, over the window.
#[derive(Default)]
pub(super) struct Counters {
    /// CPU time of this process and the processes doing Ferry's work
    /// beside it.
    pub(super) cpu: Duration,
    /// Messages sent to NATS, for a cluster.
    pub(super) nats_msgs: Option<u64>,
    /// Messages stored in JetStream's streams, for a cluster.
    pub(super) stored_msgs: Option<u64>,
    /// TCP segments the machine retransmitted.
    pub(super) tcp_retransmits: Option<u64>,
    /// Its TCP retransmission timeouts.
    pub(super) tcp_timeouts: Option<u64>,
}

impl Counters {
    /// Reads them now: the CPU of `processes` (`self` or pids), the
    /// messages of the `nats-server` whose `/varz` is given.
    pub(super) async fn read(processes: &[String], varz: Option<&str>) -> Counters {
        Counters {
            cpu: processes.iter().map(|p| process_cpu(p)).sum(),
            nats_msgs: nats_in_msgs(varz).await,
            stored_msgs: jetstream_messages(varz).await,
            tcp_retransmits: tcp_retransmitted(),
            tcp_timeouts: tcp_timeouts(),
        }
    }

    /// From reading `before` to this one.
    pub(super) fn since(self, before: Counters) -> Counters {
        let between = |before: Option<u64>, after: Option<u64>| {
            before.zip(after).map(|(b, a)| a.saturating_sub(b))
        };
        Counters {
            cpu: self.cpu.saturating_sub(before.cpu),
            nats_msgs: between(before.nats_msgs, self.nats_msgs),
            stored_msgs: between(before.stored_msgs, self.stored_msgs),
            tcp_retransmits: between(before.tcp_retransmits, self.tcp_retransmits),
            tcp_timeouts: between(before.tcp_timeouts, self.tcp_timeouts),
        }
    }

    /// Adds another window's; a count either lacks is the other's.
    pub(super) fn add(&mut self, other: Counters) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.cpu += other.cpu;
        self.nats_msgs = sum(self.nats_msgs, other.nats_msgs);
        self.stored_msgs = sum(self.stored_msgs, other.stored_msgs);
        self.tcp_retransmits = sum(self.tcp_retransmits, other.tcp_retransmits);
        self.tcp_timeouts = sum(self.tcp_timeouts, other.tcp_timeouts);
    }
}

/// `in_msgs` of a `nats-server`'s `/varz`: every message its clients sent
/// it so far. `None` without a server or when it did not answer.
pub(super) async fn nats_in_msgs(varz: Option<&str>) -> Option<u64> {
    let varz: Value = reqwest::get(varz?).await.ok()?.json().await.ok()?;
    varz.get("in_msgs")?.as_u64()
}

/// `messages` of a `nats-server`'s `/jsz` (beside the `/varz` given):
/// every message its JetStream streams hold. Ferry's streams keep every
/// message (limits retention, no age), so its growth over a window is
/// what the window stored.
async fn jetstream_messages(varz: Option<&str>) -> Option<u64> {
    let jsz = varz?.strip_suffix("/varz")?.to_owned() + "/jsz";
    let jsz: Value = reqwest::get(jsz).await.ok()?.json().await.ok()?;
    jsz.get("messages")?.as_u64()
}

/// TCP segments this machine (its network namespace) retransmitted so
/// far; `None` where that cannot be read.
fn tcp_retransmitted() -> Option<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    kernel_counter(&snmp, "Tcp:", "RetransSegs")
}

/// The retransmission timeouts this machine's TCP had so far; `None`
/// where that cannot be read.
fn tcp_timeouts() -> Option<u64> {
    let netstat = std::fs::read_to_string("/proc/net/netstat").ok()?;
    kernel_counter(&netstat, "TcpExt:", "TCPTimeouts")
}

/// One counter of `/proc/net/snmp` or `/proc/net/netstat`: each group is
/// two lines starting with its `prefix`, a header of field names, then
/// their values in the same order.
fn kernel_counter(table: &str, prefix: &str, name: &str) -> Option<u64> {
    let mut group = table.lines().filter_map(|l| l.strip_prefix(prefix));
    let (names, values) = (group.next()?, group.next()?);
    let at = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// User plus system CPU time of every thread of a process (`self` or a
/// pid) so far, from `/proc/{process}/stat` (in clock ticks of 1/100 s,
/// Linux's fixed `USER_HZ`); zero where that file does not exist.
fn process_cpu(process: &str) -> Duration {
    cpu_of_stat(&std::fs::read_to_string(format!("/proc/{process}/stat")).unwrap_or_default())
}

/// utime + stime of a `/proc/{pid}/stat` line.
fn cpu_of_stat(stat: &str) -> Duration {
    // The fields after the command name, which is in parentheses and may
    // hold spaces or parentheses: state is field 3, utime 14 and stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_utime_plus_stime_whatever_the_command_name() {
        let stat = "4242 (tokio (rt) 1) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 9";
        assert_eq!(cpu_of_stat(stat), Duration::from_millis(1750));
        assert_eq!(cpu_of_stat(""), Duration::ZERO);
    }

    #[test]
    fn kernel_counters_are_read_by_their_field_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm RtoMin ActiveOpens RetransSegs InErrs\n\
                    Tcp: 1 200 7 1347 0\n\
                    Udp: InDatagrams\nUdp: 5\n";
        assert_eq!(kernel_counter(snmp, "Tcp:", "RetransSegs"), Some(1347));
        // `MPTcpExt:` also ends in `TcpExt:`; only the group itself counts.
        let netstat = "TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes\n\
                       TcpExt: 0 12 5031\n\
                       MPTcpExt: TCPTimeouts\nMPTcpExt: 99\n";
        assert_eq!(kernel_counter(netstat, "TcpExt:", "TCPTimeouts"), Some(12));
        for bad in [
            "",
            "Tcp: RtoAlgorithm RetransSegs\n",
            "Tcp: RtoAlgorithm InErrs\nTcp: 1 0\n",
            "Tcp: RetransSegs\nTcp: many\n",
            "Tcp: RtoAlgorithm RetransSegs\nTcp: 1\n",
        ] {
            assert_eq!(kernel_counter(bad, "Tcp:", "RetransSegs"), None, "{bad:?}");
        }
        assert!(
            tcp_retransmitted().is_some() && tcp_timeouts().is_some(),
            "this machine's /proc/net/snmp and /proc/net/netstat count them"
        );
    }
}
