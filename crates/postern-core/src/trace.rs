//! The W3C Trace Context `traceparent` an agent may send in a request's `_meta` (MCP SEP-414):
//! read strictly, so that only a well-formed value is journaled (as evidence of the agent's
//! trace) and parents the execution's span in an OpenTelemetry export. Anything else is dropped,
//! never repaired.

/// A `traceparent` of version `00`: the agent's trace and the span the call was made under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Reads `00-<32 hex>-<16 hex>-<2 hex>` (lower-case hex, neither id all zeros), as the W3C
    /// Trace Context recommendation defines version 00; `None` for anything else.
    pub fn parse(text: &str) -> Option<TraceParent> {
        fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
            if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return None;
            }
            let mut out = [0u8; N];
            for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
                out[i] = u8::from_str_radix(std::str::from_utf8(chunk).ok()?, 16).ok()?;
            }
            Some(out)
        }
        let mut parts = text.split('-');
        let (Some("00"), Some(trace), Some(parent), Some(flags), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let trace_id = hex_bytes::<16>(trace)?;
        let parent_id = hex_bytes::<8>(parent)?;
        let [flags] = hex_bytes::<1>(flags)?;
        (trace_id != [0; 16] && parent_id != [0; 8]).then_some(TraceParent { trace_id, parent_id, flags })
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        write!(f, "00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.parent_id), self.flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_a_well_formed_version_00_value_reads() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let read = TraceParent::parse(good).unwrap();
        assert_eq!(read.to_string(), good);
        assert_eq!(read.flags, 1);
        for bad in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333\u{202e}-01",
            " 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn what_reads_writes_back_the_same(text in "(?s).{0,80}") {
            if let Some(t) = TraceParent::parse(&text) {
                prop_assert_eq!(t.to_string(), text);
            }
        }
    }
}
