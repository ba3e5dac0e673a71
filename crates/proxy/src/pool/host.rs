//! The `Host` header a backend is sent, made once when the backend is built rather than
//! formatted by the client for every request.

use http::HeaderValue;

/// The `Host` header of requests to `uri`, as the client would write it: the host, and the port
/// unless it is the scheme's default.
pub(super) fn host_header(uri: &http::Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let default = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let value = match uri.port_u16() {
        Some(port) if port != default => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_names_the_port_only_when_it_is_not_the_schemes_default() {
        for (uri, host) in [
            ("http://127.0.0.1:18080/v1", "127.0.0.1:18080"),
            ("http://vllm/v1", "vllm"),
            ("http://vllm:80/v1", "vllm"),
            (
                "https://r.openai.azure.com/openai/deployments/d",
                "r.openai.azure.com",
            ),
            ("https://r.openai.azure.com:443/x", "r.openai.azure.com"),
            ("https://gw:8443/v1", "gw:8443"),
            ("http://gw:443/v1", "gw:443"),
            ("http://[::1]:8000/v1", "[::1]:8000"),
        ] {
            let uri: http::Uri = uri.parse().unwrap();
            assert_eq!(host_header(&uri).unwrap(), host, "{uri}");
        }
        assert_eq!(host_header(&"/v1".parse().unwrap()), None);
    }
}
