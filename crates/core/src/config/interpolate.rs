//! Secrets kept out of the config file: in any string value of the config,
//! `${NAME}` is replaced by environment variable `NAME`, and
//! `${file:PATH}` by the contents of file `PATH` (one trailing newline
//! dropped, as a mounted Kubernetes Secret or a `docker secret` ends;
//! relative to the config file's directory). `$${` stands for a literal
//! `${`. Replaced in values only, after the TOML is parsed, so a secret
//! with quotes or backslashes cannot change the config's structure.
//!
//! Errors name the field and the variable or file, never a value. It must
//! not log: the values it reads are secrets.

use super::ConfigError;
use std::path::Path;

/// Replaces every reference in the string values of `table`; `base` is the
/// directory a relative `file:` path is read from.
pub(super) fn interpolate(table: &mut toml::Table, base: &Path) -> Result<(), ConfigError> {
    for (key, value) in table.iter_mut() {
        interpolate_value(value, key, base)?;
    }
    Ok(())
}

fn interpolate_value(value: &mut toml::Value, at: &str, base: &Path) -> Result<(), ConfigError> {
    match value {
        toml::Value::String(s) if s.contains("${") => *s = expand(s, at, base)?,
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                interpolate_value(item, &format!("{at}[{i}]"), base)?;
            }
        }
        toml::Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                interpolate_value(item, &format!("{at}.{key}"), base)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `text` with its references replaced; `at` names the field for errors.
fn expand(text: &str, at: &str, base: &Path) -> Result<String, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(format!("`{at}`: {m}"));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
            continue;
        }
        let Some(reference) = after.strip_prefix("${") else {
            out.push('$');
            rest = &after[1..];
            continue;
        };
        let Some(end) = reference.find('}') else {
            return Err(invalid(
                "`${` without its closing `}` (write `$${` for a literal `${`)".into(),
            ));
        };
        out.push_str(&resolve(&reference[..end], base).map_err(invalid)?);
        rest = &reference[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The value one reference (`NAME` or `file:PATH`) stands for.
fn resolve(reference: &str, base: &Path) -> Result<String, String> {
    if let Some(path) = reference.strip_prefix("file:") {
        let file = base.join(path);
        let text = read_secret(&file)
            .map_err(|e| format!("cannot read secret file {}: {e}", file.display()))?;
        let text = text.strip_suffix('\n').unwrap_or(&text);
        return Ok(text.strip_suffix('\r').unwrap_or(text).to_string());
    }
    let valid = !reference.is_empty()
        && reference
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(format!(
            "`${{{reference}}}` is neither `${{NAME}}` (an environment variable: letters, digits, \
             `_`) nor `${{file:PATH}}`"
        ));
    }
    std::env::var(reference).map_err(|e| match e {
        std::env::VarError::NotPresent => {
            format!("environment variable `{reference}` is not set")
        }
        std::env::VarError::NotUnicode(_) => {
            format!("environment variable `{reference}` is not UTF-8")
        }
    })
}

/// Largest secret file read, in bytes: a secret is a password, a token or
/// a certificate, and a path named by mistake (a log, `/dev/zero`) must
/// not be read whole.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// The text of secret file `file`, at most [`MAX_SECRET_BYTES`].
fn read_secret(file: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(file)?
        .take(MAX_SECRET_BYTES + 1)
        .read_to_string(&mut text)?;
    match text.len() as u64 > MAX_SECRET_BYTES {
        true => Err(std::io::Error::other(format!(
            "it is over {} KiB, too large for a secret",
            MAX_SECRET_BYTES / 1024
        ))),
        false => Ok(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(text: &str) -> Result<String, String> {
        let dir = std::env::temp_dir();
        expand(text, "sink.url", &dir).map_err(|e| e.to_string())
    }

    #[test]
    fn references_are_replaced_and_errors_name_them_not_values() {
        // SAFETY: this test alone sets and reads these variables.
        unsafe {
            std::env::set_var("SLUICE_TEST_SECRET", "pa\"ss}word");
        }
        assert_eq!(
            expanded("postgres://u:${SLUICE_TEST_SECRET}@h/db").unwrap(),
            "postgres://u:pa\"ss}word@h/db"
        );
        assert_eq!(
            expanded("cost $5, $${HOME} kept").unwrap(),
            "cost $5, ${HOME} kept"
        );
        let file = std::env::temp_dir().join(format!("sluice-secret-{}", std::process::id()));
        std::fs::write(&file, "from-a-file\n").unwrap();
        let name = file.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            expanded(&format!("x${{file:{name}}}y")).unwrap(),
            "xfrom-a-filey"
        );
        std::fs::remove_file(&file).unwrap();
        let said = expanded("${SLUICE_TEST_NOT_SET_ANYWHERE}").unwrap_err();
        assert!(
            said.contains("`sink.url`")
                && said.contains("environment variable `SLUICE_TEST_NOT_SET_ANYWHERE` is not set"),
            "{said}"
        );
        assert!(
            expanded("${file:/no/such/secret}")
                .unwrap_err()
                .contains("/no/such/secret")
        );
        let said = expanded("${file:/dev/zero}").unwrap_err();
        assert!(
            said.contains("/dev/zero") && said.contains("too large"),
            "{said}"
        );
        assert!(
            expanded("${SLUICE_TEST_SECRET")
                .unwrap_err()
                .contains("without its closing")
        );
        assert!(expanded("${a-b}").unwrap_err().contains("neither"));
    }
}
