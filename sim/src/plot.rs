//! SVG charts of the experiments (`--plot DIR`).

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::experiments::{LabelledPoint, Outcome, Plot};

/// A chart could not be written.
#[derive(Debug, thiserror::Error)]
#[error("could not draw {path}: {message}")]
pub struct PlotError {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// Writes one SVG per experiment that has a chart; returns the files written.
pub fn write_all(outcomes: &[Outcome], dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    std::fs::create_dir_all(dir).map_err(|e| PlotError {
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut written = Vec::new();
    for o in outcomes {
        let path = dir.join(format!("{}.svg", o.name));
        let drawn = match &o.plot {
            Plot::None => continue,
            Plot::Histogram { x_label, series } => {
                histogram(&path, &o.table.title, x_label, series)
            }
            Plot::Points {
                x_label,
                y_label,
                series,
            } => points(&path, &o.table.title, x_label, y_label, series),
        };
        drawn.map_err(|message| PlotError {
            path: path.clone(),
            message,
        })?;
        written.push(path);
    }
    Ok(written)
}

fn histogram(
    path: &Path,
    title: &str,
    x_label: &str,
    series: &[(String, Vec<f64>)],
) -> Result<(), String> {
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1.0_f64, f64::max);
    let bins = 40usize;
    let width = max / bins as f64;
    let counts: Vec<Vec<usize>> = series
        .iter()
        .map(|(_, v)| {
            let mut c = vec![0usize; bins];
            for x in v {
                c[((x / width) as usize).min(bins - 1)] += 1;
            }
            c
        })
        .collect();
    let top = counts.iter().flatten().copied().max().unwrap_or(1).max(1);
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max * 1.02, 0usize..top + top / 10 + 1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("runs")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, ((name, _), c)) in series.iter().zip(&counts).enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(c.iter().enumerate().map(|(b, n)| {
                let x0 = b as f64 * width;
                Rectangle::new([(x0, 0), (x0 + width, *n)], color.mix(0.5).filled())
            }))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn points(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<LabelledPoint>)],
) -> Result<(), String> {
    let max_x = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.0))
        .fold(1.0_f64, f64::max);
    let max_y = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .fold(1.0_f64, f64::max);
    let root = SVGBackend::new(path, (900, 550)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x * 1.15, 0.0..max_y * 1.15)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(
                pts.iter()
                    .map(|(x, y, _)| Circle::new((*x, *y), 5, color.filled())),
            )
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| Circle::new((x + 6, y), 5, color.filled()));
        chart
            .draw_series(
                pts.iter()
                    .map(|(x, y, label)| Text::new(label.clone(), (*x, *y), ("sans-serif", 11))),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
