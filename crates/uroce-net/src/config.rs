//! Which devices exist: one per configured address, from `UROCE_ADDR` or a config file
//! (`UROCE_CONFIG`, by default `/etc/uroce/devices`).

use core::net::IpAddr;
use std::path::Path;

/// The environment variable naming the device addresses, comma-separated.
pub const ENV: &str = "UROCE_ADDR";
/// The environment variable naming the config file.
pub const CONFIG_ENV: &str = "UROCE_CONFIG";
/// The config file read when `UROCE_ADDR` is not set (and `UROCE_CONFIG` names no other): one
/// address per line, `#` starts a comment.
pub const FILE: &str = "/etc/uroce/devices";

/// The configured addresses, or a message saying why there are none.
pub fn addresses() -> Result<Vec<IpAddr>, String> {
    match std::env::var(ENV) {
        Ok(v) => parse(&v, ENV),
        Err(_) => {
            let named = std::env::var(CONFIG_ENV).ok();
            let file = named.as_deref().unwrap_or(FILE);
            match std::fs::read_to_string(Path::new(file)) {
                Ok(text) => {
                    let lines: Vec<&str> = text
                        .lines()
                        .map(|l| l.split('#').next().unwrap_or("").trim())
                        .filter(|l| !l.is_empty())
                        .collect();
                    parse(&lines.join(","), file)
                }
                Err(e) if named.is_some() => Err(format!("uroce: {CONFIG_ENV}={file}: {e}")),
                Err(_) => Err(format!(
                    "uroce: no device configured: set {ENV}=<ip>[,<ip>...] (for example \
                     {ENV}=127.0.0.2) or list addresses in {FILE} (or a file {CONFIG_ENV} names)"
                )),
            }
        }
    }
}

/// A comma-separated address list (`from` names where it came from in the messages).
pub fn parse(list: &str, from: &str) -> Result<Vec<IpAddr>, String> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let addr: IpAddr =
            item.parse().map_err(|_| format!("uroce: {from}: {item:?} is not an IP address"))?;
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(format!("uroce: {from}: {addr} cannot be a device address"));
        }
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    if out.is_empty() {
        return Err(format!("uroce: {from} lists no address"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn lists_parse_and_bad_entries_are_named() {
        let ok = parse(" 127.0.0.2, ::1 ,127.0.0.2", "X");
        assert_eq!(ok, Ok(vec!["127.0.0.2".parse().unwrap(), "::1".parse().unwrap()]));
        assert!(parse("127.0.0.2,nonsense", "X").unwrap_err().contains("\"nonsense\""));
        assert!(parse("0.0.0.0", "X").is_err());
        assert!(parse("224.0.0.1", "X").is_err());
        assert!(parse(" , ", "X").is_err());
    }
}
