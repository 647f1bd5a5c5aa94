//! The stdout sink's own fields: `format` in `[sink]`; a stdout target has
//! none (it prints every row). Read and checked here.
//!
//! It must not print.

use serde::Deserialize;
use sluice_core::config::{ConfigError, Guarantee, KindSection, PipelineConfig};

/// The stdout sink (`stdout://`).
pub struct StdoutSection;

/// The stdout sink's own fields of `[sink]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdoutSinkFields {
    /// `json` (default: one JSON object per row and line) or `table`
    /// (aligned columns per batch, for a terminal).
    #[serde(default)]
    pub format: StdoutFormat,
}

/// A stdout target's own fields: none.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdoutTargetFields {}

/// How the stdout sink prints rows.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StdoutFormat {
    /// One JSON object per row and line.
    #[default]
    Json,
    /// A header per batch, then each target's rows in aligned columns.
    Table,
}

impl KindSection for StdoutSection {
    const FOR: &'static str = "the stdout sink";
    type Sink = StdoutSinkFields;
    type Target = StdoutTargetFields;

    fn check(config: &PipelineConfig) -> Result<(), ConfigError> {
        if config.sink.given_guarantee == Some(Guarantee::ExactlyOnce) {
            return Err(ConfigError::Invalid(
                "the stdout sink cannot be exactly-once: a terminal or a pipe takes no part in a \
                 commit, so a batch printed when the process dies is printed again after the \
                 restart (at-least-once, its default); drop `sink.guarantee` or set it to \
                 \"at-least-once\", or use a SQL, Redis or Kafka sink for exactly-once output"
                    .into(),
            ));
        }
        Self::sink(&config.sink)?;
        for target in &config.sink.targets {
            Self::target(target)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(sink: &str, target: &str) -> Result<StdoutFormat, String> {
        let sink = format!("url = \"stdout://\"\n{sink}");
        let columns = "{ n = \"integer\" }";
        let config = sluice_core::testing::sink_config(&sink, "out", columns, target)
            .map_err(|e| e.to_string())?;
        StdoutSection::check(&config).map_err(|e| e.to_string())?;
        Ok(StdoutSection::sink(&config.sink)
            .map_err(|e| e.to_string())?
            .format)
    }

    #[test]
    fn the_format_reads_and_a_target_takes_nothing_of_its_own() {
        assert_eq!(check("", ""), Ok(StdoutFormat::Json));
        assert_eq!(check("format = \"table\"", ""), Ok(StdoutFormat::Table));
        let said = check("format = \"csv\"", "").unwrap_err();
        assert!(said.contains("unknown variant `csv`"), "{said}");
        let said = check("", "table = \"t\"").unwrap_err();
        assert!(
            said.contains("unknown field `table` in target `out`: not a field of the stdout sink"),
            "{said}"
        );
    }

    #[test]
    fn exactly_once_is_refused_and_at_least_once_is_the_default() {
        let said = check("guarantee = \"exactly-once\"", "").unwrap_err();
        assert!(
            said.contains("the stdout sink cannot be exactly-once") && said.contains("Kafka sink"),
            "{said}"
        );
        assert_eq!(
            check("guarantee = \"at-least-once\"", ""),
            Ok(StdoutFormat::Json)
        );
        let config = sluice_core::testing::sink_config(
            "url = \"stdout://\"",
            "out",
            "{ n = \"integer\" }",
            "",
        )
        .unwrap();
        assert_eq!(config.sink.guarantee(), Guarantee::AtLeastOnce);
    }
}
