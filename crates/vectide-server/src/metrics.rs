//! Request counters and `/metrics` (Prometheus text exposition format).

use crate::App;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

/// Requests by (route, method, status): count and seconds spent.
#[derive(Default)]
pub struct Metrics {
    requests: BTreeMap<(String, String, u16), (u64, f64)>,
}

impl Metrics {
    /// Counts one answered request.
    pub fn record(&mut self, route: String, method: String, status: u16, seconds: f64) {
        let e = self.requests.entry((route, method, status)).or_default();
        e.0 += 1;
        e.1 += seconds;
    }

    /// The request counters as exposition text.
    fn render(&self, out: &mut String) {
        out.push_str("# HELP vectide_requests_total HTTP requests by route, method and status.\n# TYPE vectide_requests_total counter\n");
        for ((route, method, status), (n, _)) in &self.requests {
            let _ = writeln!(out, "vectide_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {n}");
        }
        out.push_str("# HELP vectide_request_seconds Time spent answering requests.\n# TYPE vectide_request_seconds summary\n");
        for ((route, method, status), (n, s)) in &self.requests {
            let labels = format!("route=\"{route}\",method=\"{method}\",status=\"{status}\"");
            let _ = writeln!(out, "vectide_request_seconds_sum{{{labels}}} {s}");
            let _ = writeln!(out, "vectide_request_seconds_count{{{labels}}} {n}");
        }
    }
}

/// `GET /metrics`: request counters, live points and engine bytes per
/// collection.
pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut out = String::new();
    app.metrics.lock().render(&mut out);
    out.push_str(
        "# HELP vectide_points Live points per collection.\n# TYPE vectide_points gauge\n",
    );
    let mut sizes = String::from("# HELP vectide_index_bytes Engine memory (or region) bytes per collection.\n# TYPE vectide_index_bytes gauge\n");
    for name in app.db.list() {
        if let Ok(c) = app.db.collection(&name) {
            let _ = writeln!(out, "vectide_points{{collection=\"{name}\"}} {}", c.len());
            let _ = writeln!(
                sizes,
                "vectide_index_bytes{{collection=\"{name}\"}} {}",
                c.stats().map_or(0, |s| s.memory_bytes)
            );
        }
    }
    out.push_str(&sizes);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        out,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::Metrics;

    #[test]
    fn counts_and_seconds_add_up_per_route_method_and_status() {
        let mut m = Metrics::default();
        m.record("/collections".into(), "GET".into(), 200, 0.5);
        m.record("/collections".into(), "GET".into(), 200, 0.25);
        m.record("/collections".into(), "GET".into(), 401, 0.1);
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains(
            "vectide_requests_total{route=\"/collections\",method=\"GET\",status=\"200\"} 2\n"
        ));
        assert!(out.contains(
            "vectide_request_seconds_sum{route=\"/collections\",method=\"GET\",status=\"200\"} 0.75\n"
        ));
        assert!(out.contains(
            "vectide_requests_total{route=\"/collections\",method=\"GET\",status=\"401\"} 1\n"
        ));
    }
}
