//! Model usage and its cost. Prices come from the operator's table (`KEEL_MODEL_PRICES`); a
//! model it does not list has its tokens recorded and its cost left unknown, never guessed.

use std::collections::BTreeMap;
use std::str::FromStr;

use keel_workers::agent::Usage;
use serde::Deserialize;

/// A model's prices in USD per million tokens, which is also micro-USD per token.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Price {
    pub(crate) input_usd_per_mtok: f64,
    pub(crate) output_usd_per_mtok: f64,
    /// For prompt tokens served from the provider's cache; the input price when absent.
    pub(crate) cached_input_usd_per_mtok: Option<f64>,
}

/// Prices by model name, exactly as the provider reports the model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable(BTreeMap<String, Price>);

impl FromStr for PriceTable {
    type Err = String;

    /// A JSON object from model name to [`Price`]; empty means no prices.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value.trim().is_empty() {
            return Ok(PriceTable::default());
        }
        let table: BTreeMap<String, Price> = serde_json::from_str(value)
            .map_err(|e| format!("KEEL_MODEL_PRICES is not a JSON price table: {e}"))?;
        for (model, price) in &table {
            let figures = [
                Some(price.input_usd_per_mtok),
                Some(price.output_usd_per_mtok),
                price.cached_input_usd_per_mtok,
            ];
            if figures
                .into_iter()
                .flatten()
                .any(|p| !p.is_finite() || p < 0.0)
            {
                return Err(format!(
                    "KEEL_MODEL_PRICES: {model}: prices must be finite and not negative"
                ));
            }
        }
        Ok(PriceTable(table))
    }
}

impl PriceTable {
    pub(crate) fn price(&self, model: &str) -> Option<&Price> {
        self.0.get(model)
    }

    /// The cost of a call in micro-USD, rounded up; None when the model has no price.
    pub(crate) fn cost_micros(&self, model: &str, usage: &Usage) -> Option<i64> {
        let price = self.price(model)?;
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let uncached = usage.prompt_tokens - cached;
        let cached_price = price
            .cached_input_usd_per_mtok
            .unwrap_or(price.input_usd_per_mtok);
        let micros = uncached as f64 * price.input_usd_per_mtok
            + cached as f64 * cached_price
            + usage.completion_tokens as f64 * price.output_usd_per_mtok;
        Some(micros.ceil() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> PriceTable {
        r#"{"gpt-test": {"input_usd_per_mtok": 2.5, "output_usd_per_mtok": 10,
             "cached_input_usd_per_mtok": 1.25}}"#
            .parse()
            .unwrap()
    }

    #[test]
    fn cost_counts_cached_tokens_at_their_price_and_rounds_up() {
        let usage = Usage {
            prompt_tokens: 1000,
            completion_tokens: 101,
            cached_tokens: 400,
        };
        // 600 × 2.5 + 400 × 1.25 + 101 × 10 = 1500 + 500 + 1010
        assert_eq!(table().cost_micros("gpt-test", &usage), Some(3010));
        let one = Usage {
            prompt_tokens: 1,
            ..Usage::default()
        };
        assert_eq!(table().cost_micros("gpt-test", &one), Some(3));
    }

    #[test]
    fn an_unknown_model_has_no_cost() {
        assert_eq!(table().cost_micros("other", &Usage::default()), None);
    }

    #[test]
    fn bad_tables_are_refused() {
        assert!("[]".parse::<PriceTable>().is_err());
        assert!(
            r#"{"m": {"input_usd_per_mtok": -1, "output_usd_per_mtok": 1}}"#
                .parse::<PriceTable>()
                .is_err()
        );
        assert!(
            r#"{"m": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 1, "x": 1}}"#
                .parse::<PriceTable>()
                .is_err()
        );
        assert_eq!("".parse::<PriceTable>().unwrap(), PriceTable::default());
    }
}
