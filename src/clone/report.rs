//! Results of the VM-clone benchmark: a CSV of every timed clone, markdown
//! tables for a report, and a PNG chart in the style of Figure 6 of the
//! VM-cloning paper (clone time per clone number, one bar colour per
//! scenario, single-run baselines as dashed lines).
//!
//! Scenarios keep the order in which they first appear in the records, in
//! every output. Where a scenario holds several records with the same clone
//! number (repeated runs), the table cell and the bar show their mean.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, anyhow, ensure};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::register_font;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One timed clone.
#[derive(Debug, Clone, Default)]
pub struct CloneRecord {
    /// Scenario name: "Local", "WAN-S1", "WAN-S2", "WAN-S3", "WAN-P cold",
    /// "WAN-P warm", "full copy", "plain NFS" (any string; the order of first
    /// appearance is kept everywhere).
    pub scenario: String,
    /// 1-based position of this clone in its scenario's sequence (x axis of
    /// the chart).
    pub clone: usize,
    /// Which golden image (1-based) was cloned.
    pub image: usize,
    /// Start of the clone to the guest verified running, seconds.
    pub total_secs: f64,
    /// Copying config, memory image and device state, seconds.
    pub copy_secs: f64,
    /// Creating the local qcow2 overlay on the golden disk, seconds.
    pub overlay_secs: f64,
    /// QEMU start to the guest verified running (resume), seconds.
    pub resume_secs: f64,
    /// Bytes that crossed the emulated WAN for this clone (both directions);
    /// for parallel clones, the scenario's total divided by the number of
    /// clones.
    pub wan_bytes: u64,
    /// Start of the clone to the guest's answer to a request that reads
    /// its `boot/` files from memory (time to responsiveness), seconds.
    pub responsive_secs: Option<f64>,
    /// Bytes across the WAN from the start of the clone until the guest
    /// was verified running (`None` without a WAN); for parallel clones,
    /// everything across the shared link until then.
    pub wan_running_bytes: Option<u64>,
    /// The same until the guest answered its request.
    pub wan_responsive_bytes: Option<u64>,
    /// Lazy clones new to their node: start of the clone to the node
    /// proxy holding the whole memory image (`None`: not measured, or not
    /// within the watch's time).
    pub whole_local_secs: Option<f64>,
    /// Clones through a node proxy: what its file cache counted during
    /// the clone (for a lazy one, and the whole-image fetch it started).
    pub fetch: Option<NodeFetch>,
}

/// A node proxy's file-cache counters over one lazy clone (the difference
/// of `gvfsctl stats --json` before and after; 0 for a counter the proxy
/// does not have).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeFetch {
    /// Compressed bytes the file cache received (`file_cache.wire_bytes`).
    pub wire_bytes: u64,
    /// Of which for chunks a reader was waiting for
    /// (`file_cache.demand_wire_bytes`).
    pub demand_wire_bytes: u64,
    /// Of which fetched first because a working-set profile named them
    /// (`file_cache.profile_wire_bytes`).
    pub profile_wire_bytes: u64,
    /// Of which fetched by the background stream
    /// (`file_cache.background_wire_bytes`).
    pub background_wire_bytes: u64,
    /// Reads that had to wait for a chunk (`file_cache.faults_waited`).
    pub faults_waited: u64,
    /// Their waits, summed (`file_cache.fault_wait_micros`).
    pub fault_wait_micros: u64,
    /// Whole-file fetches that started with a working-set profile
    /// (`file_cache.profile_hits`).
    pub profile_hits: u64,
    /// 8 KiB pieces fetched first because a profile named them
    /// (`file_cache.profile_pieces`).
    pub profile_pieces: u64,
    /// Bytes the node's FUSE mount answered READs with: what the kernel
    /// asked for the guest's page faults (`status.mount.read_bytes`).
    pub mount_read_bytes: u64,
    /// File bytes the file cache copied from blocks it held in other
    /// images instead of fetching them (`file_cache.dedup_bytes`).
    pub dedup_bytes: u64,
}

impl NodeFetch {
    /// The counters of a `gvfsctl stats` snapshot.
    pub fn from_stats(v: &crate::Stats) -> Self {
        let n = &v.file_cache.counts;
        Self {
            wire_bytes: n.wire_bytes,
            demand_wire_bytes: n.demand_wire_bytes,
            profile_wire_bytes: n.profile_wire_bytes,
            background_wire_bytes: n.background_wire_bytes,
            faults_waited: n.faults_waited,
            fault_wait_micros: n.fault_wait_micros,
            profile_hits: n.profile_hits,
            profile_pieces: n.profile_pieces,
            mount_read_bytes: v.status.mount.as_ref().map_or(0, |m| m.counts.read_bytes),
            dedup_bytes: n.dedup_bytes,
        }
    }

    /// What was counted since `before`.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            wire_bytes: self.wire_bytes.saturating_sub(before.wire_bytes),
            demand_wire_bytes: self
                .demand_wire_bytes
                .saturating_sub(before.demand_wire_bytes),
            profile_wire_bytes: self
                .profile_wire_bytes
                .saturating_sub(before.profile_wire_bytes),
            background_wire_bytes: self
                .background_wire_bytes
                .saturating_sub(before.background_wire_bytes),
            faults_waited: self.faults_waited.saturating_sub(before.faults_waited),
            fault_wait_micros: self
                .fault_wait_micros
                .saturating_sub(before.fault_wait_micros),
            profile_hits: self.profile_hits.saturating_sub(before.profile_hits),
            profile_pieces: self.profile_pieces.saturating_sub(before.profile_pieces),
            mount_read_bytes: self
                .mount_read_bytes
                .saturating_sub(before.mount_read_bytes),
            dedup_bytes: self.dedup_bytes.saturating_sub(before.dedup_bytes),
        }
    }
}

/// The first line of [`records_csv`] (columns are only ever added at the
/// end).
const CSV_HEADER: &str = "scenario,clone,image,total_secs,copy_secs,overlay_secs,resume_secs,\
                          wan_mib,responsive_secs,wan_mib_running,wan_mib_responsive,\
                          whole_local_secs";

const MIB: f64 = 1024.0 * 1024.0;

/// Scenarios drawn as a dashed baseline whatever their number of clones.
const BASELINE_SCENARIOS: &[&str] = &["full copy", "plain NFS"];

/// CSV with a header line:
/// `scenario,clone,image,total_secs,copy_secs,overlay_secs,resume_secs,wan_mib,`
/// `responsive_secs,wan_mib_running,wan_mib_responsive,whole_local_secs`
/// (seconds with 3 decimals, MiB with 1 decimal; the last four empty where
/// not measured). A scenario name is quoted only if it contains a comma, a
/// quote or a line break (RFC 4180).
pub fn records_csv(records: &[CloneRecord]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    let secs = |x: Option<f64>| x.map(|x| format!("{x:.3}")).unwrap_or_default();
    let mibs = |x: Option<u64>| x.map(|x| format!("{:.1}", mib(x))).unwrap_or_default();
    for r in records {
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{},{},{},{:.3},{:.3},{:.3},{:.3},{:.1},{},{},{},{}",
            csv_field(&r.scenario),
            r.clone,
            r.image,
            r.total_secs,
            r.copy_secs,
            r.overlay_secs,
            r.resume_secs,
            mib(r.wan_bytes),
            secs(r.responsive_secs),
            mibs(r.wan_running_bytes),
            mibs(r.wan_responsive_bytes),
            secs(r.whole_local_secs),
        );
    }
    out
}

/// Two markdown tables, one row per scenario in order of first appearance.
///
/// The first: `scenario | clone 1 | ... | clone N | mean | WAN MiB per clone
/// (mean)`, N being the largest clone number seen, seconds with 2 decimals and
/// an empty cell where a scenario has no such clone. Then a blank line and
/// the second, where the time goes: `scenario | copy (mean s) | overlay (mean
/// s) | resume (mean s) | total (mean s)`.
pub fn records_markdown(records: &[CloneRecord]) -> String {
    let scenarios = group_by_scenario(records);
    let clones = records.iter().map(|r| r.clone).max().unwrap_or(0);

    let mut header = vec!["scenario".to_string()];
    header.extend((1..=clones).map(|k| format!("clone {k}")));
    header.push("mean".to_string());
    header.push("WAN MiB per clone (mean)".to_string());
    let mut times = vec![markdown_row(&header), markdown_rule(header.len())];
    for s in &scenarios {
        let mut row = vec![markdown_text(s.name)];
        row.extend((1..=clones).map(|k| {
            s.clone_mean(k)
                .map(|secs| format!("{secs:.2}"))
                .unwrap_or_default()
        }));
        row.push(format!("{:.2}", s.mean(|r| r.total_secs)));
        row.push(format!("{:.1}", s.mean(|r| mib(r.wan_bytes))));
        times.push(markdown_row(&row));
    }

    let header = [
        "scenario",
        "copy (mean s)",
        "overlay (mean s)",
        "resume (mean s)",
        "total (mean s)",
    ];
    let mut phases = vec![markdown_row(&header), markdown_rule(header.len())];
    for s in &scenarios {
        phases.push(markdown_row(&[
            markdown_text(s.name),
            format!("{:.2}", s.mean(|r| r.copy_secs)),
            format!("{:.2}", s.mean(|r| r.overlay_secs)),
            format!("{:.2}", s.mean(|r| r.resume_secs)),
            format!("{:.2}", s.mean(|r| r.total_secs)),
        ]));
    }

    format!("{}\n\n{}\n", times.join("\n"), phases.join("\n"))
}

/// Writes a PNG chart like Figure 6 of the VM-cloning paper to `path`
/// (which must end in `.png`): clone time per clone number (x: 1..N) as
/// grouped bars, one colour per scenario, on a logarithmic seconds axis.
///
/// Scenarios with exactly one clone, and "full copy" and "plain NFS", are
/// baselines: a dashed horizontal line across the chart at their mean time,
/// named with its value in the legend. Times at or below zero are drawn at
/// 0.01 s, which a log axis can show; an empty record list, a non-finite
/// time or a clone number 0 is an error.
///
/// Text needs a TrueType font from the system: `GVFS_CHART_FONT` if set,
/// else DejaVu Sans (Debian package fonts-dejavu-core) or another common
/// sans-serif font.
pub fn write_chart(records: &[CloneRecord], title: &str, path: &Path) -> Result<()> {
    let chart = ChartData::from_records(records).context("preparing the clone chart")?;
    let is_png = path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("png"));
    ensure!(
        is_png,
        "chart path {} must end in .png (the file format follows the extension)",
        path.display()
    );
    register_chart_font()?;
    draw_chart(&chart, title, path).with_context(|| format!("drawing chart {}", path.display()))
}

/// A scenario's records, in input order.
struct Scenario<'a> {
    name: &'a str,
    records: Vec<&'a CloneRecord>,
}

impl Scenario<'_> {
    fn mean(&self, field: impl Fn(&CloneRecord) -> f64) -> f64 {
        let sum: f64 = self.records.iter().map(|r| field(r)).sum();
        sum / self.records.len() as f64
    }

    /// Mean total time of this scenario's clones numbered `clone`, if any.
    fn clone_mean(&self, clone: usize) -> Option<f64> {
        let times: Vec<f64> = self
            .records
            .iter()
            .filter(|r| r.clone == clone)
            .map(|r| r.total_secs)
            .collect();
        (!times.is_empty()).then(|| times.iter().sum::<f64>() / times.len() as f64)
    }

    fn is_baseline(&self) -> bool {
        self.records.len() == 1 || BASELINE_SCENARIOS.contains(&self.name)
    }
}

fn group_by_scenario(records: &[CloneRecord]) -> Vec<Scenario<'_>> {
    let mut scenarios: Vec<Scenario<'_>> = Vec::new();
    for r in records {
        match scenarios.iter_mut().find(|s| s.name == r.scenario) {
            Some(s) => s.records.push(r),
            None => scenarios.push(Scenario {
                name: &r.scenario,
                records: vec![r],
            }),
        }
    }
    scenarios
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn markdown_row<S: AsRef<str>>(cells: &[S]) -> String {
    let cells: Vec<&str> = cells.iter().map(AsRef::as_ref).collect();
    format!("| {} |", cells.join(" | "))
}

/// The header rule: the first (name) column left-aligned, numbers right.
fn markdown_rule(columns: usize) -> String {
    let mut cells = vec!["---"];
    cells.extend(std::iter::repeat_n("---:", columns.saturating_sub(1)));
    markdown_row(&cells)
}

/// A scenario name as a table cell: a `|` would split the cell.
fn markdown_text(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

// --- The chart ---

const CHART_SIZE: (u32, u32) = (1000, 600);
/// Width of the legend panel right of the plot, pixels.
const LEGEND_WIDTH: u32 = 220;
/// The smallest time drawn: a log axis cannot show zero.
const MIN_SECS: f64 = 0.01;
/// Share of the space between two clone numbers taken by a group of bars.
const GROUP_WIDTH: f64 = 0.8;
/// Bar colours, Tableau 10: distinct and legible on white, given in the
/// order bar scenarios first appear (repeated if there are more than ten).
const BAR_PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
/// Baseline colours: dark, so a thin dashed line and its label read well
/// and do not look like one of the bars.
const BASELINE_PALETTE: [RGBColor; 4] = [
    RGBColor(20, 20, 20),
    RGBColor(110, 110, 110),
    RGBColor(160, 30, 120),
    RGBColor(20, 90, 90),
];

/// The chart's plotted values, checked and clamped.
struct ChartData<'a> {
    /// The largest clone number: the x axis runs 1..=clones.
    clones: usize,
    series: Vec<Series<'a>>,
}

struct Series<'a> {
    name: &'a str,
    color: RGBColor,
    kind: SeriesKind,
}

enum SeriesKind {
    /// Seconds per clone number (index 0 is clone 1); `None` where missing.
    Bars(Vec<Option<f64>>),
    /// A dashed horizontal line at this many seconds.
    Baseline(f64),
}

impl<'a> ChartData<'a> {
    fn from_records(records: &'a [CloneRecord]) -> Result<Self> {
        ensure!(!records.is_empty(), "no clone records to chart");
        for r in records {
            ensure!(
                r.total_secs.is_finite(),
                "scenario {:?} clone {} took {} s: not a finite time",
                r.scenario,
                r.clone,
                r.total_secs
            );
            ensure!(
                r.clone >= 1,
                "scenario {:?} has clone number 0: clone numbers start at 1",
                r.scenario
            );
        }
        let clones = records.iter().map(|r| r.clone).max().unwrap_or(1);
        let mut bar_colors = BAR_PALETTE.iter().cycle();
        let mut baseline_colors = BASELINE_PALETTE.iter().cycle();
        let series = group_by_scenario(records)
            .iter()
            .map(|s| {
                let (kind, color) = if s.is_baseline() {
                    let secs = s.mean(|r| r.total_secs).max(MIN_SECS);
                    (SeriesKind::Baseline(secs), baseline_colors.next())
                } else {
                    let secs = (1..=clones)
                        .map(|k| s.clone_mean(k).map(|secs| secs.max(MIN_SECS)))
                        .collect();
                    (SeriesKind::Bars(secs), bar_colors.next())
                };
                Series {
                    name: s.name,
                    color: color.copied().unwrap_or(BLACK),
                    kind,
                }
            })
            .collect();
        Ok(Self { clones, series })
    }

    fn bar_series(&self) -> impl Iterator<Item = (&Series<'a>, &[Option<f64>])> {
        self.series.iter().filter_map(|s| match &s.kind {
            SeriesKind::Bars(secs) => Some((s, secs.as_slice())),
            SeriesKind::Baseline(_) => None,
        })
    }

    fn baselines(&self) -> impl Iterator<Item = (&Series<'a>, f64)> {
        self.series.iter().filter_map(|s| match s.kind {
            SeriesKind::Baseline(secs) => Some((s, secs)),
            SeriesKind::Bars(_) => None,
        })
    }

    /// The y range: half the fastest to twice the slowest, so the shortest
    /// bar still shows and baseline labels fit above their lines.
    fn y_range(&self) -> (f64, f64) {
        let all = self.series.iter().flat_map(|s| match &s.kind {
            SeriesKind::Bars(secs) => secs.iter().flatten().copied().collect(),
            SeriesKind::Baseline(secs) => vec![*secs],
        });
        // Every series has at least one value, all >= MIN_SECS; starting
        // from MIN_SECS keeps the range valid all the same.
        let (lo, hi) = all.fold((f64::INFINITY, MIN_SECS), |(lo, hi), secs| {
            (lo.min(secs), hi.max(secs))
        });
        (lo.min(hi) / 2.0, hi * 2.0)
    }
}

/// The font family every text on the chart uses.
const FONT_FAMILY: &str = "sans-serif";
/// A TrueType/OpenType file to use instead of the system fonts below.
const FONT_ENV: &str = "GVFS_CHART_FONT";
/// Where common systems keep a plain sans-serif font, most likely first.
const FONT_CANDIDATES: &[&str] = &[
    // Debian/Ubuntu: fonts-dejavu-core.
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    // Fedora, Arch.
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    // Debian/Ubuntu: fonts-liberation.
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    // macOS.
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
];

/// Whether [`FONT_FAMILY`] is registered with plotters. The lock also keeps
/// two threads from loading (and leaking) the font at the same time.
static FONT_REGISTERED: Mutex<bool> = Mutex::new(false);

/// Registers a system font as [`FONT_FAMILY`], once per process: plotters'
/// `ab_glyph` text has no font of its own.
fn register_chart_font() -> Result<()> {
    let mut registered = FONT_REGISTERED
        .lock()
        .map_err(|_| anyhow!("chart font registration lock poisoned"))?;
    if *registered {
        return Ok(());
    }
    let path = chart_font_path()?;
    let bytes =
        std::fs::read(&path).with_context(|| format!("reading chart font {}", path.display()))?;
    // plotters keeps registered fonts for the life of the process and wants
    // 'static bytes: this one copy is leaked on purpose.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font(FONT_FAMILY, FontStyle::Normal, bytes).map_err(|_| {
        anyhow!(
            "chart font {} is not a TrueType/OpenType font (set {FONT_ENV} to another)",
            path.display()
        )
    })?;
    *registered = true;
    Ok(())
}

fn chart_font_path() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(FONT_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        ensure!(
            path.is_file(),
            "{FONT_ENV}={} is not a font file",
            path.display()
        );
        return Ok(path);
    }
    FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!(
                "no font for the chart text: install the fonts-dejavu-core package \
                 or set {FONT_ENV} to a .ttf file (looked in {})",
                FONT_CANDIDATES.join(", ")
            )
        })
}

fn draw_chart(chart: &ChartData<'_>, title: &str, path: &Path) -> Result<()> {
    let root = BitMapBackend::new(path, CHART_SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let body = root.titled(title, (FONT_FAMILY, 26))?;
    let (plot_area, legend_area) = body.split_horizontally(CHART_SIZE.0 - LEGEND_WIDTH);

    let (y_lo, y_hi) = chart.y_range();
    let x_hi = chart.clones as f64 + 0.5;
    let mut plot = ChartBuilder::on(&plot_area)
        .margin(10)
        .x_label_area_size(50)
        .y_label_area_size(65)
        .build_cartesian_2d(0.5..x_hi, (y_lo..y_hi).log_scale())?;
    plot.configure_mesh()
        .disable_x_mesh()
        .x_desc("clone")
        .y_desc("seconds")
        .x_labels(chart.clones)
        .x_label_formatter(&|x| clone_tick_label(*x))
        // Enough labels that the log axis has a grid line at 1..9 in every
        // decade; only 1, 2 and 5 get a number.
        .y_labels(30)
        .y_label_formatter(&|y| seconds_tick_label(*y))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(TRANSPARENT)
        .label_style((FONT_FAMILY, 15))
        .axis_desc_style((FONT_FAMILY, 17))
        .draw()?;

    let bars: Vec<_> = chart.bar_series().collect();
    let bar_width = GROUP_WIDTH / bars.len().max(1) as f64;
    for (i, (series, secs)) in bars.iter().enumerate() {
        let style = series.color.filled();
        plot.draw_series(secs.iter().enumerate().filter_map(|(k, secs)| {
            let left = (k + 1) as f64 - GROUP_WIDTH / 2.0 + i as f64 * bar_width;
            let secs = (*secs)?;
            Some(Rectangle::new(
                [
                    (left + 0.1 * bar_width, y_lo),
                    (left + 0.9 * bar_width, secs),
                ],
                style,
            ))
        }))?;
    }
    // Each baseline is named just above its line at the left end, or at the
    // right end when that would overwrite the label of a close baseline, or
    // only in the legend when both ends are taken.
    let mut left_rows: Vec<i32> = Vec::new();
    let mut right_rows: Vec<i32> = Vec::new();
    for (series, secs) in chart.baselines() {
        plot.draw_series(std::iter::once(DashedPathElement::new(
            vec![(0.5, secs), (x_hi, secs)],
            12,
            6,
            series.color.stroke_width(2),
        )))?;
        let row = plot.backend_coord(&(0.5, secs)).1;
        let free = |rows: &[i32]| rows.iter().all(|&other| (other - row).abs() >= 20);
        let (anchor, hpos, dx) = if free(&left_rows) {
            left_rows.push(row);
            (0.5, HPos::Left, 6)
        } else if free(&right_rows) {
            right_rows.push(row);
            (x_hi, HPos::Right, -6)
        } else {
            continue;
        };
        let label_style = (FONT_FAMILY, 15)
            .into_font()
            .color(&series.color)
            .pos(Pos::new(hpos, VPos::Bottom));
        plot.draw_series(std::iter::once(
            EmptyElement::at((anchor, secs))
                + Text::new(baseline_label(series.name, secs), (dx, -4), label_style),
        ))?;
    }

    draw_legend(&legend_area, chart)?;
    root.present()?;
    Ok(())
}

/// The legend, in its own panel so it never hides a bar or a line: a colour
/// swatch per bar scenario, a dashed sample and the value per baseline.
fn draw_legend<DB>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    chart: &ChartData<'_>,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let text = (FONT_FAMILY, 16)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let (x, text_x, line_height) = (8, 42, 28);
    let text_width = area.dim_in_pixel().0.saturating_sub(text_x as u32 + 8);
    let mut y = 30;
    for series in &chart.series {
        let label = match series.kind {
            SeriesKind::Bars(_) => {
                area.draw(&Rectangle::new(
                    [(x + 4, y - 8), (x + 24, y + 8)],
                    series.color.filled(),
                ))?;
                series.name.to_string()
            }
            SeriesKind::Baseline(secs) => {
                area.draw(&DashedPathElement::new(
                    vec![(x, y), (x + 28, y)],
                    8,
                    4,
                    series.color.stroke_width(2),
                ))?;
                baseline_label(series.name, secs)
            }
        };
        let label = fit_text(area, label, &text, text_width)?;
        area.draw(&Text::new(label, (text_x, y), text.clone()))?;
        y += line_height;
    }
    Ok(())
}

/// Shortens `text` with an ellipsis until it is at most `width` pixels wide.
fn fit_text<DB>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    text: String,
    style: &TextStyle<'_>,
    width: u32,
) -> Result<String>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let mut fitted = text.clone();
    let mut chars: Vec<char> = text.chars().collect();
    while area.estimate_text_size(&fitted, style)?.0 > width && chars.len() > 1 {
        chars.pop();
        fitted = chars.iter().collect::<String>() + "…";
    }
    Ok(fitted)
}

fn baseline_label(name: &str, secs: f64) -> String {
    format!("{name}: {secs:.1} s")
}

/// Labels whole clone numbers only: the axis is continuous so bars can sit
/// side by side within a clone number.
fn clone_tick_label(x: f64) -> String {
    let clone = x.round();
    if (x - clone).abs() < 1e-6 && clone >= 1.0 {
        format!("{clone:.0}")
    } else {
        String::new()
    }
}

/// Labels 1, 2 and 5 times a power of ten; the other ticks of the log axis
/// stay as unlabelled grid lines.
fn seconds_tick_label(secs: f64) -> String {
    if !(secs.is_finite() && secs > 0.0) {
        return String::new();
    }
    let exponent = secs.log10().floor();
    let mantissa = secs / 10_f64.powf(exponent);
    let round = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 1e-6);
    if !round {
        return String::new();
    }
    let decimals = (-exponent).max(0.0) as usize;
    format!("{secs:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(scenario: &str, clone: usize, total_secs: f64) -> CloneRecord {
        CloneRecord {
            scenario: scenario.to_string(),
            clone,
            image: (clone - 1) % 4 + 1,
            total_secs,
            copy_secs: total_secs * 0.5,
            overlay_secs: 0.05,
            resume_secs: total_secs * 0.5 - 0.05,
            wan_bytes: (total_secs * 10.0 * MIB) as u64,
            ..CloneRecord::default()
        }
    }

    /// The shape of the paper's Figure 6: fast local and warm clones, slow
    /// first WAN clones, and full-copy and plain-NFS baselines far above.
    fn realistic_records() -> Vec<CloneRecord> {
        let mut records = Vec::new();
        let wobble = |k: usize| 1.0 + 0.03 * ((k * 7 % 5) as f64 - 2.0);
        for k in 1..=8 {
            records.push(record("Local", k, 1.2 * wobble(k)));
        }
        for k in 1..=8 {
            let secs = if k == 1 { 7.0 } else { 1.5 * wobble(k) };
            records.push(record("WAN-S1", k, secs));
        }
        for (name, secs) in [
            ("WAN-S2", 7.0),
            ("WAN-S3", 2.0),
            ("WAN-P cold", 8.0),
            ("WAN-P warm", 2.0),
        ] {
            for k in 1..=8 {
                records.push(record(name, k, secs * wobble(k)));
            }
        }
        records.push(record("full copy", 1, 95.0));
        records.push(record("plain NFS", 1, 60.0));
        records
    }

    fn is_png(bytes: &[u8]) -> bool {
        bytes.starts_with(b"\x89PNG\r\n\x1a\n")
    }

    #[test]
    fn csv_has_header_and_one_line_per_record() {
        let mut quoted = record("WAN, \"cold\"", 2, 7.0);
        quoted.wan_bytes = 3 * 1024 * 1024 + 512 * 1024;
        quoted.responsive_secs = Some(7.5);
        quoted.wan_running_bytes = Some(1024 * 1024);
        quoted.wan_responsive_bytes = Some(2 * 1024 * 1024);
        quoted.whole_local_secs = Some(9.25);
        let csv = records_csv(&[record("Local", 1, 1.2345), quoted]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            "scenario,clone,image,total_secs,copy_secs,overlay_secs,resume_secs,wan_mib,\
             responsive_secs,wan_mib_running,wan_mib_responsive,whole_local_secs"
        );
        assert_eq!(lines[1], "Local,1,1,1.234,0.617,0.050,0.567,12.3,,,,");
        assert_eq!(
            lines[2],
            "\"WAN, \"\"cold\"\"\",2,2,7.000,3.500,0.050,3.450,3.5,7.500,1.0,2.0,9.250"
        );
        assert!(csv.ends_with('\n'));
    }

    #[test]
    fn markdown_has_a_column_per_clone_and_keeps_scenario_order() {
        let records = vec![
            record("WAN-S1", 1, 7.0),
            record("Local", 1, 1.0),
            record("WAN-S1", 2, 1.5),
            record("Local", 3, 2.0),
            record("full copy", 1, 95.0),
        ];
        let markdown = records_markdown(&records);
        let (times, phases) = markdown
            .split_once("\n\n")
            .expect("two tables separated by a blank line");
        let times: Vec<&str> = times.lines().collect();
        assert_eq!(
            times[0],
            "| scenario | clone 1 | clone 2 | clone 3 | mean | WAN MiB per clone (mean) |"
        );
        assert_eq!(times[1], "| --- | ---: | ---: | ---: | ---: | ---: |");
        assert_eq!(times[2], "| WAN-S1 | 7.00 | 1.50 |  | 4.25 | 42.5 |");
        assert_eq!(times[3], "| Local | 1.00 |  | 2.00 | 1.50 | 15.0 |");
        assert_eq!(times[4], "| full copy | 95.00 |  |  | 95.00 | 950.0 |");
        assert_eq!(times.len(), 5);

        let phases: Vec<&str> = phases.lines().collect();
        assert_eq!(
            phases[0],
            "| scenario | copy (mean s) | overlay (mean s) | resume (mean s) | total (mean s) |"
        );
        assert_eq!(phases[2], "| WAN-S1 | 2.12 | 0.05 | 2.08 | 4.25 |");
        assert_eq!(phases[3], "| Local | 0.75 | 0.05 | 0.70 | 1.50 |");
        assert_eq!(phases[4], "| full copy | 47.50 | 0.05 | 47.45 | 95.00 |");
        assert_eq!(phases.len(), 5);
    }

    #[test]
    fn markdown_of_nothing_is_two_empty_tables() {
        let markdown = records_markdown(&[]);
        assert!(markdown.starts_with("| scenario | mean | WAN MiB per clone (mean) |\n"));
        assert_eq!(markdown.lines().count(), 5);
    }

    #[test]
    fn chart_is_a_png() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let path = dir.path().join("clones.png");
        write_chart(&realistic_records(), "VM clone time per clone", &path).expect("chart written");
        let bytes = std::fs::read(&path).expect("chart read back");
        assert!(is_png(&bytes), "not a PNG signature");
        assert!(bytes.len() > 10 * 1024, "only {} bytes", bytes.len());
    }

    #[test]
    fn chart_draws_zero_seconds_and_lone_baselines() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let path = dir.path().join("odd.png");
        let records = vec![
            record("instant", 1, 0.0),
            record("instant", 2, -1.0),
            record("full copy", 1, 95.0),
        ];
        write_chart(&records, "odd", &path).expect("chart written");
        assert!(is_png(&std::fs::read(&path).expect("chart read back")));

        let only_baseline = vec![record("plain NFS", 1, 60.0)];
        write_chart(&only_baseline, "baseline only", &path).expect("chart written");
    }

    #[test]
    fn chart_of_nothing_is_an_error() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let path = dir.path().join("empty.png");
        let err = write_chart(&[], "empty", &path).expect_err("no records");
        assert!(format!("{err:#}").contains("no clone records"), "{err:#}");
        assert!(!path.exists());
    }

    #[test]
    fn chart_rejects_bad_input() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let path = dir.path().join("bad.png");
        let nan = vec![record("Local", 1, f64::NAN), record("Local", 2, 1.0)];
        assert!(write_chart(&nan, "nan", &path).is_err());
        let infinite = vec![record("Local", 1, f64::INFINITY)];
        assert!(write_chart(&infinite, "inf", &path).is_err());
        let mut zeroth = vec![record("Local", 1, 1.0), record("Local", 2, 1.0)];
        zeroth[0].clone = 0;
        assert!(write_chart(&zeroth, "zeroth", &path).is_err());
        let not_png = dir.path().join("chart.jpg");
        assert!(write_chart(&realistic_records(), "jpg", &not_png).is_err());
    }

    #[test]
    fn tick_labels() {
        assert_eq!(clone_tick_label(3.0), "3");
        assert_eq!(clone_tick_label(2.5), "");
        assert_eq!(clone_tick_label(0.0), "");
        assert_eq!(seconds_tick_label(1.0), "1");
        assert_eq!(seconds_tick_label(20.000000001), "20");
        assert_eq!(seconds_tick_label(0.5), "0.5");
        assert_eq!(seconds_tick_label(0.05), "0.05");
        assert_eq!(seconds_tick_label(3.0), "");
        assert_eq!(seconds_tick_label(0.0), "");
    }
}
