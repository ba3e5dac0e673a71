//! What the store accepts as names and text, checked once before any query.
//!
//! Tenant names end up in metric labels, log lines, URLs of the admin API and CLI output, so they
//! are short and drawn from a small alphabet; free text (descriptions, model and pool names) is
//! bounded and has no control characters, so a value can never forge a log line or a table row.
//! Both backends get the same answer for the same input because neither is asked.

use crate::StoreError;

/// Longest tenant name, in characters.
pub const MAX_TENANT_NAME_CHARS: usize = 64;
/// Longest key description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 200;
/// Longest model or pool name, in characters.
const MAX_REFERENCE_CHARS: usize = 256;

/// The entry of an allowed-models list that stands for every model, as in the config file.
pub const ANY_MODEL: &str = "*";

/// 1 to 64 characters of `A-Z a-z 0-9 . _ -`, other than `.` and `..`.
///
/// `.` and `..` are refused because a name is also a path segment of the admin API
/// (`/admin/tenants/{name}`), where clients and proxies resolve them away.
pub fn tenant_name(name: &str) -> Result<(), StoreError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > MAX_TENANT_NAME_CHARS || !name.chars().all(allowed) {
        return Err(StoreError::Invalid(format!(
            "tenant name {name:?}: use 1 to {MAX_TENANT_NAME_CHARS} characters of A-Z, a-z, \
             0-9, '.', '_' and '-'"
        )));
    }
    if name == "." || name == ".." {
        return Err(StoreError::Invalid(format!(
            "tenant name {name:?}: '.' and '..' are not names (they are path steps in the admin API's URLs)"
        )));
    }
    Ok(())
}

/// A tenant's limit, when it has one, is at least 1: a limit of 0 would refuse every request
/// for good, and "no limit" is said by giving none.
pub(crate) fn limit(field: &str, value: Option<u32>) -> Result<(), StoreError> {
    if value == Some(0) {
        return Err(StoreError::Invalid(format!(
            "{field} must be at least 1: 0 would refuse every request (for no limit, give none)"
        )));
    }
    Ok(())
}

/// An allowed-models list as stored: `None` (every model) when it names [`ANY_MODEL`].
pub(crate) fn allowed_models(list: Option<&[String]>) -> Option<&[String]> {
    list.filter(|models| !models.iter().any(|m| m == ANY_MODEL))
}

/// A new key's expiry, if it has one, is after `now` (Unix seconds): a key that could never
/// authenticate is a mistake worth saying so.
pub(crate) fn expiry(expires_at: Option<i64>, now: i64) -> Result<(), StoreError> {
    match expires_at {
        Some(at) if at <= now => Err(StoreError::Invalid(format!(
            "expires_at {at} is not in the future (now is {now}, Unix seconds): the key would never work"
        ))),
        _ => Ok(()),
    }
}

/// Up to 200 characters, none of them control characters.
pub(crate) fn description(text: &str) -> Result<(), StoreError> {
    let chars = text.chars().count();
    if chars > MAX_DESCRIPTION_CHARS {
        return Err(StoreError::Invalid(format!(
            "description of {chars} characters: at most {MAX_DESCRIPTION_CHARS} are allowed"
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(StoreError::Invalid(
            "description: control characters (such as newlines) are not allowed".to_owned(),
        ));
    }
    Ok(())
}

/// A model or pool name: what the config calls it, so only its size and characters are checked.
pub(crate) fn reference(kind: &str, name: &str) -> Result<(), StoreError> {
    if name.is_empty()
        || name.chars().count() > MAX_REFERENCE_CHARS
        || name.chars().any(char::is_control)
    {
        return Err(StoreError::Invalid(format!(
            "{kind} name {name:?}: use 1 to {MAX_REFERENCE_CHARS} characters, no control characters"
        )));
    }
    Ok(())
}

/// The optional lists and names of a tenant. Whether they name what the config has is the
/// gateway's to say: the store does not know the config.
pub(crate) fn tenant_references(
    allowed_models: Option<&[String]>,
    pool: Option<&str>,
    default_model: Option<&str>,
) -> Result<(), StoreError> {
    for model in allowed_models.unwrap_or_default() {
        reference("model", model)?;
    }
    if let Some(pool) = pool {
        reference("pool", pool)?;
    }
    if let Some(model) = default_model {
        reference("model", model)?;
        if allowed_models.is_some_and(|list| !list.iter().any(|m| m == model)) {
            return Err(StoreError::Invalid(format!(
                "default_model {model:?} is not among the tenant's allowed_models"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names() {
        for ok in ["a", "team-a", "Team_A.prod", &"x".repeat(64)] {
            assert_eq!(tenant_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".", "..", "a b", "a/b", "é", "a\n", &"x".repeat(65)] {
            assert!(
                matches!(tenant_name(bad), Err(StoreError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn limits_of_zero_are_refused() {
        assert_eq!(limit("requests_per_min", None), Ok(()));
        assert_eq!(limit("requests_per_min", Some(1)), Ok(()));
        assert!(matches!(
            limit("requests_per_min", Some(0)),
            Err(StoreError::Invalid(why)) if why.contains("requests_per_min")
        ));
    }

    #[test]
    fn a_star_allows_every_model() {
        let star = ["m".to_owned(), "*".to_owned()];
        assert_eq!(allowed_models(Some(&star)), None);
        let listed = ["m".to_owned()];
        assert_eq!(allowed_models(Some(&listed)), Some(&listed[..]));
        assert_eq!(allowed_models(Some(&[])), Some(&[][..]));
    }

    #[test]
    fn expiries_in_the_past_are_refused() {
        assert_eq!(expiry(None, 100), Ok(()));
        assert_eq!(expiry(Some(101), 100), Ok(()));
        assert!(expiry(Some(100), 100).is_err());
        assert!(expiry(Some(-5), 100).is_err());
    }

    #[test]
    fn descriptions() {
        assert_eq!(description(""), Ok(()));
        assert_eq!(description(&"é".repeat(200)), Ok(()));
        assert!(description(&"x".repeat(201)).is_err());
        assert!(description("two\nlines").is_err());
    }

    #[test]
    fn references() {
        let models = ["gpt-4o".to_owned(), "org/model:v1".to_owned()];
        assert_eq!(
            tenant_references(Some(&models), Some("eu-pool"), Some("gpt-4o")),
            Ok(())
        );
        assert!(tenant_references(Some(&[String::new()]), None, None).is_err());
        assert!(tenant_references(None, Some("a\tb"), None).is_err());
        assert_eq!(tenant_references(None, None, None), Ok(()));
        assert_eq!(tenant_references(None, None, Some("any-model")), Ok(()));
        assert!(tenant_references(None, None, Some("")).is_err());
        // A default the tenant could not use is a mistake worth refusing.
        assert!(matches!(
            tenant_references(Some(&models), None, Some("other")),
            Err(StoreError::Invalid(_))
        ));
    }
}
