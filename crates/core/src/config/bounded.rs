//! A number with bounds: a config field's type states its range once, and
//! the check and its message follow from it.
//!
//! It must not know any field: the field's name comes with the check.

use super::ConfigError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A whole number in `MIN..=MAX` (no upper bound by default), checked when
/// the config is validated ([`Bounded::check`]), so the error names the
/// field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Bounded<const MIN: u64, const MAX: u64 = { u64::MAX }>(u64);

impl<const MIN: u64, const MAX: u64> Bounded<MIN, MAX> {
    /// A value known to be in range (a default); out of range is a bug,
    /// caught at compile time where it is a constant.
    pub const fn at(value: u64) -> Self {
        assert!(MIN <= value && value <= MAX, "a default out of its bounds");
        Bounded(value)
    }

    /// A value from the user (a command-line flag), not yet checked: call
    /// [`Bounded::check`] before using it.
    pub const fn given(value: u64) -> Self {
        Bounded(value)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Refuses a value out of range, naming `field` (`limits.max_stack_kib`).
    pub fn check(self, field: &str) -> Result<(), ConfigError> {
        match self.out_of_bounds(field) {
            Some(message) => Err(ConfigError::Invalid(message)),
            None => Ok(()),
        }
    }

    /// What is wrong with the value, if it is out of range, naming `field`.
    pub fn out_of_bounds(self, field: &str) -> Option<String> {
        let value = self.0;
        // A bound no one reaches (a whole `u32` or `u64`) goes unsaid.
        let unbounded = MAX >= u32::MAX as u64;
        match value {
            _ if (MIN..=MAX).contains(&value) => None,
            _ if value < MIN && unbounded => {
                Some(format!("`{field}` must be at least {MIN} (it is {value})"))
            }
            _ => Some(format!("`{field}` = {value} is outside {MIN}..={MAX}")),
        }
    }
}

impl<const MIN: u64, const MAX: u64> fmt::Display for Bounded<MIN, MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Field {
        n: Bounded<64, 8192>,
        #[serde(default)]
        at_least: Option<Bounded<1>>,
        #[serde(default)]
        whole: Option<Bounded<1, { u32::MAX as u64 }>>,
    }

    #[test]
    fn a_value_out_of_range_is_refused_naming_the_field() {
        let cases = [
            ("n = 64", Ok(())),
            ("n = 8192\nat_least = 1", Ok(())),
            ("n = 63", Err("`x.n` = 63 is outside 64..=8192")),
            ("n = 8193", Err("`x.n` = 8193 is outside 64..=8192")),
            (
                "n = 64\nat_least = 0",
                Err("`x.at_least` must be at least 1 (it is 0)"),
            ),
        ];
        for (text, expected) in cases {
            let field: Field = toml::from_str(text).unwrap();
            let checked = field
                .n
                .check("x.n")
                .and_then(|()| field.at_least.map_or(Ok(()), |b| b.check("x.at_least")))
                .and_then(|()| field.whole.map_or(Ok(()), |b| b.check("x.whole")));
            match (checked, expected) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(says)) => assert!(e.to_string().contains(says), "{text}: {e}"),
                (got, expected) => panic!("{text}: {got:?}, expected {expected:?}"),
            }
        }
        assert_eq!(Bounded::<1, 10>::at(3).get(), 3);
    }
}
