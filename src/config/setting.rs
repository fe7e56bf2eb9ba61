//! A value the user may leave to rustccl: `auto` (or unset) lets
//! the tuning rules choose it from the group and the host; a number fixes it.
#![forbid(unsafe_code)]

/// One setting's value as read: left to rustccl, or fixed by the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting<T> {
    Auto,
    Fixed(T),
}

/// A byte threshold no transfer reaches: a size setting's `off` (never).
pub const NEVER: usize = usize::MAX;

impl<T: Copy> Setting<T> {
    /// The fixed value, or `auto()` where the setting is left to rustccl.
    pub fn or_auto(self, auto: impl FnOnce() -> T) -> T {
        match self {
            Setting::Auto => auto(),
            Setting::Fixed(v) => v,
        }
    }

    pub fn is_auto(self) -> bool {
        matches!(self, Setting::Auto)
    }

    pub fn fixed(self) -> Option<T> {
        match self {
            Setting::Auto => None,
            Setting::Fixed(v) => Some(v),
        }
    }
}

impl Setting<usize> {
    /// The value as `rustccl.config()` shows it: `auto`, the number, or
    /// `never` (e.g. "off") for [`NEVER`].
    pub fn show(self, never: &str) -> String {
        match self {
            Setting::Auto => "auto".into(),
            Setting::Fixed(NEVER) if !never.is_empty() => never.into(),
            Setting::Fixed(v) => v.to_string(),
        }
    }
}

impl Setting<bool> {
    pub fn show(self) -> String {
        self.fixed().map_or("auto".into(), |on| (on as u8).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::{Setting, NEVER};

    #[test]
    fn auto_takes_the_rule_and_a_fixed_value_wins() {
        assert_eq!(Setting::Auto.or_auto(|| 7), 7);
        assert_eq!(Setting::Fixed(3).or_auto(|| 7), 3);
        assert_eq!(
            (Setting::<usize>::Auto.show("off"), Setting::Fixed(NEVER).show("off"), Setting::Fixed(5).show("off")),
            ("auto".into(), "off".into(), "5".into())
        );
        assert_eq!((Setting::Fixed(true).show(), Setting::<bool>::Auto.show()), ("1".into(), "auto".into()));
    }
}
