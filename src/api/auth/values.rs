//! Reading the values a credential carries, the same way in every form: a header sent
//! exactly once ([`single`]) and a display name ([`checked_name`]).

use axum::http::HeaderMap;

const MAX_NAME_LEN: usize = 256;

/// The header's value when it is sent exactly once: a repeated identity header is ambiguous.
pub(super) fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values
        .next()
        .is_none()
        .then(|| value.to_str().ok())
        .flatten()
}

/// A display name: up to 256 characters, no control characters.
pub(super) fn checked_name(value: &str) -> Option<String> {
    (value.chars().count() <= MAX_NAME_LEN && !value.chars().any(char::is_control))
        .then(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_have_no_control_characters() {
        assert!(checked_name("Ada Lovelace").is_some());
        assert!(checked_name("bad\nname").is_none());
    }
}
