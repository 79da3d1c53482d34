//! The command-line spelling of the etcd driver.

use super::super::DriverError;

/// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` without its scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSpec {
    /// `http://HOST:PORT` for each member given.
    pub endpoints: Vec<String>,
    /// Every key of this cluster starts with it; `/sheep` when none is given.
    pub prefix: String,
}

impl EtcdSpec {
    pub fn parse(rest: &str) -> Result<EtcdSpec, DriverError> {
        let bad = || DriverError::UnknownDriver(format!("etcd://{rest}"));
        let (hosts, prefix) = match rest.split_once('/') {
            Some((h, p)) => (h, format!("/{}", p.trim_matches('/'))),
            None => (rest, "/sheep".to_string()),
        };
        if prefix == "/" || hosts.is_empty() {
            return Err(bad());
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h.rsplit_once(':').ok_or_else(bad)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad());
            }
            endpoints.push(format!("http://{h}"));
        }
        Ok(EtcdSpec { endpoints, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing() {
        let s = EtcdSpec::parse("127.0.0.1:2379").unwrap();
        assert_eq!(s.endpoints, vec!["http://127.0.0.1:2379"]);
        assert_eq!(s.prefix, "/sheep");
        let s = EtcdSpec::parse("a:1,b:2/x/y/").unwrap();
        assert_eq!(s.endpoints, vec!["http://a:1", "http://b:2"]);
        assert_eq!(s.prefix, "/x/y");
        for bad in ["", "/p", "a", "a:", ":1", "a:99999", "a:1/", "a:1,,b:2"] {
            assert!(EtcdSpec::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
