//! The plot of scenario 6, in two panels over the run's seconds: with the
//! shedder on, the fraction Envoy sheds of each class and the upstream's
//! utilization; below it, the critical class's latency (the p50 of each
//! second's served requests) with the shedder on and off, on a log scale.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::plot::{register_font, FONT};
use super::shed::Shedding;
use super::shed_load::CLASSES;

const SIZE: (u32, u32) = (1100, 900);
/// critical, interactive, batch.
const CLASS_COLORS: [RGBColor; 3] = [RGBColor(219, 68, 55), RGBColor(66, 133, 244), RGBColor(251, 188, 5)];
const UTILIZATION: RGBColor = RGBColor(120, 120, 120);
/// Shedder on, off.
const RUN_COLORS: [RGBColor; 2] = [RGBColor(15, 157, 88), RGBColor(219, 68, 55)];

pub(crate) fn draw(png: &Path, font: &Path, title: &str, shedding: &Shedding) -> Result<()> {
    register_font(font)?;
    draw_with_font(png, title, shedding).map_err(|e| anyhow!("drawing {}: {e}", png.display()))
}

fn draw_with_font(png: &Path, title: &str, shedding: &Shedding) -> Result<(), Box<dyn std::error::Error>> {
    let canvas = BitMapBackend::new(png, SIZE).into_drawing_area();
    canvas.fill(&WHITE)?;
    let root = canvas.titled(title, (FONT, 24))?;
    let (top, bottom) = root.split_vertically(SIZE.1 / 2);
    let plan = &shedding.plan;
    let end = (plan.overload + plan.calm).as_secs_f64();
    let overload_end = plan.overload.as_secs_f64();
    let [on, off] = &shedding.runs;

    let mut chart = ChartBuilder::on(&top)
        .caption("shedder on: fraction shed per class (Envoy's gauge), upstream utilization", (FONT, 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..end, 0f64..1.05)?;
    chart.configure_mesh().x_desc("seconds").y_desc("fraction").label_style((FONT, 14)).draw()?;
    chart.draw_series(LineSeries::new(
        [(overload_end, 0.0), (overload_end, 1.05)],
        BLACK.mix(0.4).stroke_width(1),
    ))?;
    let utilization = on.samples.iter().map(|s| (s.at.as_secs_f64(), s.utilization));
    chart
        .draw_series(LineSeries::new(utilization, UTILIZATION.stroke_width(1)))?
        .label("upstream utilization")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], UTILIZATION.stroke_width(2)));
    for (i, class) in CLASSES.iter().enumerate() {
        let color = CLASS_COLORS[i];
        let line = on.samples.iter().map(|s| (s.at.as_secs_f64(), s.shed[i]));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(3)))?
            .label(format!("{} shed", class.name))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(3)));
    }
    legend(&mut chart)?;

    let latencies: Vec<Vec<(f64, f64)>> = [on, off].iter().map(|run| run.latency_by_second(0)).collect();
    let highest = latencies.iter().flatten().map(|(_, ms)| *ms).fold(10.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&bottom)
        .caption("critical class: p50 latency of each second's served requests", (FONT, 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..end, (1f64..highest).log_scale())?;
    chart.configure_mesh().x_desc("seconds").y_desc("latency (ms)").label_style((FONT, 14)).draw()?;
    chart.draw_series(LineSeries::new(
        [(overload_end, 1.0), (overload_end, highest)],
        BLACK.mix(0.4).stroke_width(1),
    ))?;
    for (k, (line, label)) in latencies.into_iter().zip(["shedder on", "shedder off"]).enumerate() {
        let color = RUN_COLORS[k];
        chart
            .draw_series(LineSeries::new(
                line.into_iter().map(|(t, ms)| (t, ms.max(1.0))),
                color.stroke_width(3),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(3)));
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

fn legend<'a, X, Y>(chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
        .map_err(|e| e.to_string())
}
