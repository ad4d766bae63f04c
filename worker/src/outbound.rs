//! Which networks Ferry's own requests may reach: discovery, invocations,
//! notifications and `response_url` deliveries all go through one client
//! ([`Outbound`]), whose resolver refuses a name that resolves into a
//! network the operator closed. A check in the resolver holds for every
//! connection the client opens, after a redirect or a DNS answer that
//! changed since a URL was checked; an IP literal, which is never
//! resolved, is checked before the request ([`Outbound::check`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

/// The networks outbound requests may reach: none denied and, when any are
/// allowed, only those. Empty, every destination is open (a demo on
/// loopback needs nothing set).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Networks {
    allow: Vec<IpNet>,
    deny: Vec<IpNet>,
}

impl Networks {
    pub fn new(allow: Vec<IpNet>, deny: Vec<IpNet>) -> Self {
        Self { allow, deny }
    }

    /// Whether a request may go to `ip`. An IPv4 address written as IPv6
    /// (`::ffff:10.0.0.1`) is judged as the IPv4 address it is.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        !self.deny.iter().any(|net| net.contains(&ip))
            && (self.allow.is_empty() || self.allow.iter().any(|net| net.contains(&ip)))
    }

    fn is_open(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }
}

/// A destination in a network Ferry may not reach. What it says names
/// neither the address nor the networks: the one who named the
/// destination learns only that it is closed to Ferry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the destination is in a network Ferry may not reach")]
pub struct Refused;

impl Refused {
    /// Whether `error` (a failed request) was this refusal, from the
    /// resolver or [`Outbound::check`].
    pub fn caused(error: &reqwest::Error) -> bool {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(e) = source {
            if e.downcast_ref::<Refused>().is_some() {
                return true;
            }
            source = e.source();
        }
        false
    }
}

/// The HTTP client of every request Ferry makes, with the networks it may
/// reach.
#[derive(Clone)]
pub struct Outbound {
    client: reqwest::Client,
    networks: Arc<Networks>,
}

impl Outbound {
    /// The client Ferry sends with: no proxy (a proxy would resolve the
    /// names, out of the networks' reach), no redirects (a redirect would
    /// turn an invocation POST into a body-less GET that could still answer
    /// 200: a 3xx must end the dispatch instead), and the resolver that
    /// keeps to `networks`.
    pub fn new(networks: Networks) -> Result<Self, reqwest::Error> {
        let networks = Arc::new(networks);
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(256);
        if !networks.is_open() {
            builder = builder.dns_resolver(Arc::new(Resolver {
                networks: networks.clone(),
            }));
        }
        Ok(Self {
            client: builder.build()?,
            networks,
        })
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Refuses `url` when its host is an IP address Ferry may not reach
    /// (the resolver judges names, and never sees an IP literal).
    pub fn check(&self, url: &Url) -> Result<(), Refused> {
        let ip = match url.host() {
            Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
            _ => return Ok(()),
        };
        if self.networks.permits(ip) {
            Ok(())
        } else {
            Err(Refused)
        }
    }

    /// [`Outbound::check`] of a URL not parsed yet; one that does not parse
    /// is left to the request to refuse.
    pub fn check_str(&self, url: &str) -> Result<(), Refused> {
        match Url::parse(url) {
            Ok(url) => self.check(&url),
            Err(_) => Ok(()),
        }
    }
}

/// Every network open: for tests and tools that set none.
impl From<reqwest::Client> for Outbound {
    fn from(client: reqwest::Client) -> Self {
        Self {
            client,
            networks: Arc::default(),
        }
    }
}

/// The system's resolver, refusing a name when any address it resolves to
/// is closed: connecting to the others only would let a name that resolves
/// to a public and a private address reach the private one on a retry.
struct Resolver {
    networks: Arc<Networks>,
}

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        let networks = self.networks.clone();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            if addrs.iter().any(|a| !networks.permits(a.ip())) {
                return Err(Box::new(Refused) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Networks, Outbound, Refused};

    fn nets(list: &[&str]) -> Vec<ipnet::IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn a_denied_network_wins_and_an_allow_list_closes_the_rest() {
        let open = Networks::default();
        assert!(open.permits("10.0.0.1".parse().unwrap()));
        let denied = Networks::new(vec![], nets(&["127.0.0.0/8", "fd00::/8"]));
        assert!(!denied.permits("127.0.0.2".parse().unwrap()));
        assert!(!denied.permits("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!denied.permits("fd00::1".parse().unwrap()));
        assert!(denied.permits("10.0.0.1".parse().unwrap()));
        let allowed = Networks::new(nets(&["10.0.0.0/8"]), nets(&["10.9.0.0/16"]));
        assert!(allowed.permits("10.1.2.3".parse().unwrap()));
        assert!(!allowed.permits("10.9.0.1".parse().unwrap()));
        assert!(!allowed.permits("192.168.0.1".parse().unwrap()));
    }

    #[test]
    fn an_ip_literal_is_checked_and_a_name_left_to_the_resolver() {
        let outbound = Outbound::new(Networks::new(vec![], nets(&["169.254.0.0/16"]))).unwrap();
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert_eq!(
            outbound.check(&url("http://169.254.169.254/")),
            Err(Refused)
        );
        assert_eq!(
            outbound.check(&url("http://[::ffff:169.254.1.1]/")),
            Err(Refused)
        );
        assert_eq!(outbound.check(&url("http://10.0.0.1:9/")), Ok(()));
        assert_eq!(outbound.check(&url("http://metadata.internal/")), Ok(()));
    }

    #[tokio::test]
    async fn a_name_resolving_into_a_denied_network_is_refused_by_the_client() {
        let outbound =
            Outbound::new(Networks::new(vec![], nets(&["127.0.0.0/8", "::1/128"]))).unwrap();
        let error = outbound
            .client()
            .get("http://localhost:9/")
            .send()
            .await
            .unwrap_err();
        assert!(Refused::caused(&error), "{error:?}");
    }
}
