//! How the summary's tables show numbers: a goals table's rows, numbers
//! to two places, and means.

use crate::clone::outcome::Goal;

/// The mean of `xs`; `None` when there are none.
pub(super) fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// The rows of a goals table: `| goal | measured | ratio | verdict |`.
pub(super) fn goals_rows(goals: &[Goal]) -> String {
    goals
        .iter()
        .map(|g| {
            format!(
                "| {} | {} {unit} vs {} {unit} | {} | {} |\n",
                g.name,
                fmt(g.measured),
                fmt(g.against),
                g.ratio_text(),
                g.verdict(),
                unit = g.unit
            )
        })
        .collect()
}

fn fmt(x: Option<f64>) -> String {
    x.map_or("n/a".to_owned(), |x| format!("{x:.2}"))
}
