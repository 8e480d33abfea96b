//! A small HTTP client for `relay admin`, tools and tests.

use crate::{outbound, tls, Rules};

/// A small HTTP client for tools and tests (http or https, no redirects, any address).
pub struct AdminClient(outbound::Peers);

impl AdminClient {
    /// POSTs `body` to `url`; returns the status and body.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let e = self.0.exchange(hyper::Method::POST, url, headers, body);
        Self::answer(url, e.await)
    }

    /// GETs `url`.
    pub async fn get(&self, url: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        let e = self.0.exchange(hyper::Method::GET, url, &[], Vec::new());
        Self::answer(url, e.await)
    }

    fn answer(url: &str, e: outbound::Exchange) -> anyhow::Result<(u16, Vec<u8>)> {
        match e {
            outbound::Exchange::Answered(s, b) => Ok((s, b)),
            outbound::Exchange::NotSent(e) | outbound::Exchange::Unknown(e) => {
                anyhow::bail!("{url}: {e}")
            }
        }
    }
}

/// A client for `relay admin` and tests.
pub fn admin_client() -> AdminClient {
    AdminClient(outbound::Peers::new())
}

/// A client that trusts only the CA certificates in `pem` for https (tests of TLS).
pub fn admin_client_trusting(pem: &[u8]) -> anyhow::Result<AdminClient> {
    Ok(AdminClient(outbound::Peers::build(
        Rules::open(),
        tls::client_config_trusting(pem)?,
        std::time::Duration::from_secs(20),
    )))
}
