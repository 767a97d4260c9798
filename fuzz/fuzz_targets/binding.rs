//! Credential bindings and URL normalisation: a binding only ever allows URLs on its own host
//! (and pinned port), whatever the host, prefix and URL look like.
#![no_main]
use libfuzzer_sys::fuzz_target;
use postern_vault::Binding;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\u{1}');
    let (host, prefix, raw) = (parts.next().unwrap_or(""), parts.next(), parts.next().unwrap_or(""));
    let _ = postern_core::record::normalise_url(raw);
    let Ok(binding) = Binding::new(host, prefix) else { return };
    let Ok(url) = url::Url::parse(raw) else { return };
    if binding.allows(&url) {
        let bound_host = binding.host.rsplit_once(':').map_or(binding.host.as_str(), |(h, _)| h);
        let bound_host = if binding.host.starts_with('[') { binding.host.as_str() } else { bound_host };
        assert!(
            url.host_str() == Some(bound_host) || binding.host.starts_with('['),
            "{url} allowed by a binding to {}",
            binding.host
        );
        if let Some(p) = &binding.path_prefix {
            assert!(url.path() == p || url.path().starts_with(&format!("{p}/")), "{url} outside {p}");
        }
    }
});
