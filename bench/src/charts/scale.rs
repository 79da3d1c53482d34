//! Group "scale" (recovery's cost at scale): entries fetched to plan per object owned against
//! the number of nodes, and the planning time against the objects per node.

use super::{Chart, Lines, Plot, Series};
use crate::figures::{Figure, Report};
use crate::report::query::param_f64;

/// Points (x, value) of the scale figures of jobs starting with `job` and target `target`, x
/// the parameter `key`, sorted by x.
fn points(r: &Report, job: &str, target: &str, key: &str) -> Vec<(f64, f64, String)> {
    let mut v: Vec<(f64, f64, String)> = (r.figures.iter())
        .filter(|f| f.group == "scale" && f.job.starts_with(job) && f.target == target)
        .filter_map(|f: &Figure| Some((param_f64(f, key)?, f.value, format!("{:.2}", f.value))))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// `scale-vs-nodes`: entries fetched per object owned, at a join and at a kill.
pub fn by_nodes(r: &Report) -> Result<Chart, String> {
    let series: Vec<Series> = [
        ("the joiner, at a join", "join-", "joiner"),
        ("every node, at a join", "join-", "all"),
        ("every node, at a kill", "kill-", "all"),
    ]
    .into_iter()
    .map(|(name, job, target)| Series {
        name: name.into(),
        points: points(r, job, target, "nodes"),
    })
    .filter(|s| !s.points.is_empty())
    .collect();
    if series.iter().all(|s| s.points.len() < 2) {
        return Err("scale-vs-nodes: fewer than two cluster sizes in group scale".into());
    }
    Ok(Chart {
        stem: "scale-vs-nodes".into(),
        title: "Recovery planning: entries fetched per object owned, by nodes".into(),
        plot: Plot::Lines(Lines {
            x_desc: "nodes".into(),
            y_desc: "entries fetched / object owned".into(),
            categories: Vec::new(),
            series,
            levels: vec![("2 entries an object".into(), 2.0)],
        }),
    })
}

/// `scale-vs-objects`: the restarted node's plan against the objects per node (a category
/// each: they go up by tenfolds).
pub fn by_objects(r: &Report) -> Result<Chart, String> {
    let plan = points(r, "restart-", "plan", "objects_per_node");
    if plan.len() < 2 {
        return Err("scale-vs-objects: fewer than two sizes in group scale".into());
    }
    let categories = plan.iter().map(|(x, _, _)| format!("{x:e}")).collect();
    let points = (plan.iter().enumerate())
        .map(|(i, (_, y, _))| (i as f64, *y, format!("{y:.0} ms")))
        .collect();
    Ok(Chart {
        stem: "scale-vs-objects".into(),
        title: "Recovery planning: a restarted node's plan, by objects per node".into(),
        plot: Plot::Lines(Lines {
            x_desc: "objects per node".into(),
            y_desc: "ms".into(),
            categories,
            series: vec![Series {
                name: "plan".into(),
                points,
            }],
            levels: vec![("1 s".into(), 1000.0)],
        }),
    })
}
