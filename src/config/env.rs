//! Reading settings from the environment: byte counts with units, plain
//! counts, yes / no flags, and values left to the host ("auto").
#![forbid(unsafe_code)]

/// A byte count, or `None` for unset / empty / "auto" (at most 256 MiB).
pub(super) fn env_auto_size(name: &str) -> Option<usize> {
    match std::env::var(name).as_deref() {
        Err(_) | Ok("") | Ok("auto") => None,
        Ok(_) => Some(env_usize(name, 1 << 20).min(256 << 20)),
    }
}

/// Whether a yes / no setting is on ("1", "true" or "TRUE"), read now.
pub fn env_flag(name: &str) -> bool {
    matches!(std::env::var(name).as_deref(), Ok("1") | Ok("true") | Ok("TRUE"))
}

/// A yes / no setting that may be left to the host: `None` unset or
/// "auto", else whether it is on as [`env_flag`] reads it (one read).
pub(super) fn env_auto_flag(name: &str) -> Option<bool> {
    let v = std::env::var(name).ok()?;
    (v.trim() != "auto").then_some(matches!(v.as_str(), "1" | "true" | "TRUE"))
}

/// A setting that is on unless set to 0 / false / off.
pub(super) fn env_on(name: &str) -> bool {
    !matches!(std::env::var(name).as_deref().map(str::trim), Ok("0" | "false" | "FALSE" | "off"))
}

pub(super) fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => parse_size(&v).unwrap_or_else(|| {
            eprintln!("rustccl: ignoring {name}={v:?}: not a byte count");
            default
        }),
        Err(_) => default,
    }
}

/// A byte count, or one of `words` (e.g. `("auto", X)`, `("off",
/// usize::MAX)`), each read trimmed and standing for its value; unset:
/// `default`.
pub(super) fn env_usize_or(name: &str, default: usize, words: &[(&str, usize)]) -> usize {
    word(name, words).unwrap_or_else(|| env_usize(name, default))
}

/// As [`env_usize_or`] for a plain count ([`env_count`]).
pub(super) fn env_count_or(name: &str, default: usize, words: &[(&str, usize)]) -> usize {
    word(name, words).unwrap_or_else(|| env_count(name, default))
}

/// The value of the word the setting is set to, if it is one of `words`.
fn word(name: &str, words: &[(&str, usize)]) -> Option<usize> {
    let v = std::env::var(name).ok()?;
    words.iter().find(|(w, _)| *w == v.trim()).map(|&(_, x)| x)
}

/// A setting that counts something other than bytes (threads, entries,
/// microseconds): a plain whole number; anything else is ignored, with a
/// message.
pub(super) fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("rustccl: ignoring {name}={v:?}: not a whole number");
            default
        }),
        Err(_) => default,
    }
}

/// Parses "65536", "64K", "64KiB", "1M", "2MiB".
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: usize = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn counts_take_plain_numbers_only() {
        // Names no other test reads, so setting them races with nothing.
        std::env::set_var("RUSTCCL_TEST_COUNT_PLAIN", " 12 ");
        std::env::set_var("RUSTCCL_TEST_COUNT_UNIT", "64K");
        assert_eq!(env_count("RUSTCCL_TEST_COUNT_PLAIN", 3), 12);
        assert_eq!(env_count("RUSTCCL_TEST_COUNT_UNIT", 3), 3, "a byte unit on a count is ignored");
        assert_eq!(env_count("RUSTCCL_TEST_COUNT_UNSET", 3), 3);
        assert_eq!(env_usize("RUSTCCL_TEST_COUNT_UNIT", 3), 65536);
    }

    #[test]
    fn words_stand_for_their_values_and_anything_else_reads_as_a_number() {
        // Names no other test reads, so setting them races with nothing.
        let words = [("off", usize::MAX), ("auto", 7)];
        for (v, want) in [(" off ", usize::MAX), ("auto", 7), ("2M", 2 << 20), ("never", 7)] {
            std::env::set_var("RUSTCCL_TEST_WORDS", v);
            assert_eq!(env_usize_or("RUSTCCL_TEST_WORDS", 7, &words), want, "{v:?}");
        }
        std::env::set_var("RUSTCCL_TEST_COUNT_WORDS", "auto");
        assert_eq!(env_count_or("RUSTCCL_TEST_COUNT_WORDS", 3, &[("auto", 9)]), 9);
        std::env::set_var("RUSTCCL_TEST_COUNT_WORDS", "64K");
        assert_eq!(env_count_or("RUSTCCL_TEST_COUNT_WORDS", 3, &[("auto", 9)]), 3, "a byte unit on a count is ignored");
        assert_eq!(env_usize_or("RUSTCCL_TEST_WORDS_UNSET", 5, &words), 5);
    }

    #[test]
    fn auto_flags_read_once_as_flags() {
        // Names no other test reads, so setting them races with nothing.
        for (v, want) in [(" auto ", None), ("1", Some(true)), ("true", Some(true)), ("0", Some(false)), ("", Some(false)), (" 1", Some(false))] {
            std::env::set_var("RUSTCCL_TEST_AUTO_FLAG", v);
            assert_eq!(env_auto_flag("RUSTCCL_TEST_AUTO_FLAG"), want, "{v:?}");
        }
        assert_eq!(env_auto_flag("RUSTCCL_TEST_AUTO_FLAG_UNSET"), None);
    }
}
