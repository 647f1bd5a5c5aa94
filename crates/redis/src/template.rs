//! Templates that build a key, field or value from a row's columns:
//! literal text with `{column}` placeholders (`{{` and `}}` for literal
//! braces), as the Redis sink's commands declare them.
//!
//! Owns parsing and checking a template against the declared columns, so
//! a bad one is refused when the config is read. It must not render:
//! turning a row's values into bytes is `render.rs`'s.

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text taken as is.
    Literal(String),
    /// The value of this column.
    Column(String),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub source: String,
    pub pieces: Vec<Piece>,
}

impl Template {
    /// Parses `source`; every placeholder must name one of `columns`.
    pub fn parse<'a>(
        source: &str,
        columns: impl IntoIterator<Item = &'a String> + Clone,
    ) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = source.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => {
                                return Err(format!("template {source:?}: `{{` is never closed"));
                            }
                        }
                    }
                    if !columns.clone().into_iter().any(|c| *c == name) {
                        let declared: Vec<&String> = columns.clone().into_iter().collect();
                        return Err(format!(
                            "template {source:?} names column `{name}`, which the target does \
                             not declare (it declares {declared:?})"
                        ));
                    }
                    if !literal.is_empty() {
                        pieces.push(Piece::Literal(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Column(name));
                }
                '}' => {
                    return Err(format!(
                        "template {source:?}: a lone `}}` (write `}}}}` for a literal one)"
                    ));
                }
                other => literal.push(other),
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        if pieces.is_empty() {
            return Err("a template must not be empty".into());
        }
        Ok(Template {
            source: source.to_string(),
            pieces,
        })
    }

    /// The template's text if it has no placeholder.
    pub fn literal(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [Piece::Literal(text)] => Some(text),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols() -> Vec<String> {
        vec!["day".into(), "user".into()]
    }

    #[test]
    fn placeholders_and_escapes_parse() {
        let t = Template::parse("seen:{day}:{{x}}", &cols()).unwrap();
        assert_eq!(
            t.pieces,
            [
                Piece::Literal("seen:".into()),
                Piece::Column("day".into()),
                Piece::Literal(":{x}".into())
            ]
        );
        assert_eq!(Template::parse("1", &cols()).unwrap().literal(), Some("1"));
    }

    #[test]
    fn bad_templates_are_refused_with_the_reason() {
        let err = Template::parse("seen:{dya}", &cols()).unwrap_err();
        assert!(err.contains("names column `dya`"), "{err}");
        assert!(Template::parse("", &cols()).unwrap_err().contains("empty"));
        assert!(
            Template::parse("a{day", &cols())
                .unwrap_err()
                .contains("never closed")
        );
        assert!(
            Template::parse("a}b", &cols())
                .unwrap_err()
                .contains("lone")
        );
    }
}
