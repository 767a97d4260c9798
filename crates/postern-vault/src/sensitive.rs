//! `Sensitive<T>`: how a secret travels through Postern's memory.
//!
//! It prints as `<redacted>`, implements neither `Serialize` nor `Display`, and wipes its bytes
//! when dropped, so a secret cannot reach a log line, a journal row or an error message by
//! accident: the only way to the value is the explicit [`Sensitive::expose`].

use std::fmt;
use zeroize::Zeroize;

pub struct Sensitive<T: Zeroize>(T);

impl<T: Zeroize> Sensitive<T> {
    pub fn new(value: T) -> Self {
        Sensitive(value)
    }

    /// The secret itself. Call sites are few and reviewed: the channel that injects it.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T: Zeroize> Drop for Sensitive<T> {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl<T: Zeroize> fmt::Debug for Sensitive<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Sensitive::new(String::from("CANARY-hunter2"));
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(&s)), "Some(<redacted>)");
        assert_eq!(s.expose(), "CANARY-hunter2");
    }
}
