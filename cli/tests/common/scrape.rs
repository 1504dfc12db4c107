//! Reading a Prometheus/OpenMetrics endpoint in tests (serve's and the
//! worker's `--metrics`).

use std::time::{Duration, Instant};

/// The metrics URL (`http://…/metrics`) a `serve --metrics` process
/// announced on its log.
pub fn metrics_url(server: &super::Proc) -> String {
    let line = server.wait_line("metrics at http://");
    line.split("metrics at ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("metrics URL")
        .to_owned()
}

/// The value of the sample `series` (name and labels exactly as exposed).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// One scrape: 200, OpenMetrics text; returns the body.
pub async fn scrape(http: &reqwest::Client, url: &str) -> String {
    let response = http.get(url).send().await.expect("scrape");
    assert_eq!(response.status(), 200);
    let kind = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    response.text().await.expect("body")
}

/// Scrapes until `check` holds for the text (at most `deadline`); returns it.
pub async fn scrape_until(
    http: &reqwest::Client,
    url: &str,
    what: &str,
    deadline: Duration,
    check: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + deadline;
    loop {
        let text = scrape(http, url).await;
        if check(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} never showed:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
