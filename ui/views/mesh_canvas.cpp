// MeshCanvas; see mesh_canvas.h. The scene holds one NodeItem per node (its box, header and tiles) and a
// message (an OverlayItem that ignores the view's transform and follows the viewport's top-left corner, so it
// stays readable at any zoom). Hit tests go through MeshGeometry, never through the
// scene's items. The items are in mesh_canvas_items.h, the new-type dialog in type_dialog.h, the edits behind
// the actions and the layer drop in mesh_canvas_edits.cpp.
#include "ui/views/mesh_canvas.h"

#include "plan/parameter_server.h"

#include <QAction>
#include <QContextMenuEvent>
#include <QDragEnterEvent>
#include <QGraphicsItem>
#include <QGraphicsScene>
#include <QMenu>
#include <QMimeData>
#include <QPainter>
#include <QTimer>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

#include "plan/hardware.h"
#include "plan/model_spec.h"
#include "ui/models/layer_model.h"
#include "ui/models/placement.h"
#include "ui/models/plan_analysis.h"
#include "ui/models/project_document.h"
#include "ui/models/units.h"
#include "ui/views/mesh_canvas_items.h"

namespace ms {

namespace {

constexpr double kMinScale = 0.005;  // the whole 16384-device mesh fits a small window above this
constexpr double kMaxScale = 8;
constexpr double kMaxFitScale = 1.5;  // a one-device mesh is not blown up to fill the window
constexpr int kOverlayMargin = 10;    // viewport pixels between an overlay and the viewport's edge
constexpr int kMessageMillis = 8000;
const QColor kIdleColor(208, 208, 208);

std::optional<DeviceSpec> deviceSpec(const MeshConfig& mesh, const std::string& name) {
  for (const DeviceTypeConfig& t : mesh.deviceTypes)
    if (t.name == name) return toDeviceSpec(t);
  return findDevice(name);
}

}  // namespace

using canvas_detail::kRefuseColor;
using canvas_detail::linkText;
using canvas_detail::NodeItem;
using canvas_detail::OverlayItem;

MeshCanvas::MeshCanvas(ProjectDocument* doc, QWidget* parent)
    : QGraphicsView(parent), m_doc(doc), m_scene(new QGraphicsScene(this)) {
  setScene(m_scene);
  setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
  setTransformationAnchor(AnchorUnderMouse);
  setViewportUpdateMode(SmartViewportUpdate);
  setDragMode(ScrollHandDrag);
  setAcceptDrops(true);
  setBackgroundBrush(QColor(232, 234, 237));
  auto* message = new OverlayItem;
  m_message = message;
  m_scene->addItem(message);
  message->setVisible(false);
  m_messageTimer = new QTimer(this);
  m_messageTimer->setSingleShot(true);
  connect(m_messageTimer, &QTimer::timeout, this, &MeshCanvas::hideMessage);
  setFitMode(true);
  createActions();
  connect(doc, &ProjectDocument::configChanged, this, &MeshCanvas::rebuild);
  rebuild();
}

MeshCanvas::~MeshCanvas() = default;

void MeshCanvas::createActions() {
  const auto make = [this](const QString& text, const QString& tip, auto slot) {
    auto* a = new QAction(text, this);
    a->setToolTip(tip);
    connect(a, &QAction::triggered, this, slot);
    addAction(a);
    return a;
  };
  m_addNode =
      make(tr("Add node"), tr("Add a node like the selected one (or the last)"), [this] { addNode(); });
  m_duplicateNode = make(tr("Duplicate node"), tr("Insert a copy of the selected node after it"),
                         [this] { duplicateNode(targetNode()); });
  m_removeNode =
      make(tr("Remove node"), tr("Remove the selected node"), [this] { removeNode(m_selectedNode); });
  m_addDevice = make(tr("Add device"), tr("Add a device to the selected node (or the last)"),
                     [this] { addDevice(targetNode()); });
  m_removeDevice =
      make(tr("Remove device"), tr("Remove the selected device"), [this] { removeDevice(m_selectedDevice); });
  m_removeDevice->setShortcut(QKeySequence::Delete);
  m_removeDevice->setShortcutContext(Qt::WidgetWithChildrenShortcut);
  m_deviceType = new QAction(tr("Device type"), this);
  m_deviceType->setToolTip(tr("Set the selected node's device type, or define a new type"));
  auto* typeMenu = new QMenu(this);
  connect(typeMenu, &QMenu::aboutToShow, this,
          [this, typeMenu] { fillDeviceTypeMenu(typeMenu, targetNode()); });
  m_deviceType->setMenu(typeMenu);
  m_links = new QAction(tr("Links"), this);
  m_links->setToolTip(tr("Set the intra-node and inter-node link types"));
  auto* linkMenu = new QMenu(this);
  auto* intraMenu = linkMenu->addMenu(tr("Intra-node link"));
  auto* interMenu = linkMenu->addMenu(tr("Inter-node link"));
  connect(intraMenu, &QMenu::aboutToShow, this, [this, intraMenu] { fillLinkMenu(intraMenu, true); });
  connect(interMenu, &QMenu::aboutToShow, this, [this, interMenu] { fillLinkMenu(interMenu, false); });
  m_links->setMenu(linkMenu);
  m_zoomIn = make(tr("Zoom in"), tr("Zoom in (Ctrl+wheel)"), [this] { zoomIn(); });
  m_zoomIn->setShortcut(QKeySequence::ZoomIn);
  m_zoomIn->setShortcutContext(Qt::WidgetWithChildrenShortcut);
  m_zoomOut = make(tr("Zoom out"), tr("Zoom out (Ctrl+wheel)"), [this] { zoomOut(); });
  m_zoomOut->setShortcut(QKeySequence::ZoomOut);
  m_zoomOut->setShortcutContext(Qt::WidgetWithChildrenShortcut);
  m_fit = make(tr("Fit"), tr("Show the whole mesh"), [this] { fitAll(); });
  for (QAction*& separator : m_separators) {
    separator = new QAction(this);
    separator->setSeparator(true);
  }
}

QList<QAction*> MeshCanvas::editActions() const {
  return {m_addNode,    m_duplicateNode, m_removeNode,    m_separators[0], m_addDevice, m_removeDevice,
          m_deviceType, m_links,         m_separators[1], m_zoomIn,        m_zoomOut,   m_fit};
}

void MeshCanvas::updateActions() {
  const int nodes = m_geometry.nodeCount();
  m_removeNode->setEnabled(m_selectedNode >= 0 && nodes > 1);
  m_removeDevice->setEnabled(m_selectedDevice >= 0 && m_geometry.deviceCount() > 1);
  m_duplicateNode->setEnabled(nodes > 0);
  m_addDevice->setEnabled(nodes > 0);
  m_deviceType->setEnabled(nodes > 0);
}

int MeshCanvas::targetNode() const {
  return m_selectedNode >= 0 ? m_selectedNode : m_geometry.nodeCount() - 1;
}

void MeshCanvas::rebuild() {
  const RunConfig& config = m_doc->config();
  const MeshGeometry geometry = MeshGeometry::fromMesh(config.mesh);
  const bool reshaped = geometry.sceneRect() != m_geometry.sceneRect();
  m_geometry = geometry;
  m_ranks = MeshRanks::compute(config);
  m_memory.clear();  // a snapshot of this config will bring them back
  m_intraText = linkText(config.mesh, config.mesh.intraLink);
  m_interText = linkText(config.mesh, config.mesh.interLink);

  // Layers of each stage, chunk by chunk (none while the model or the placement does not resolve).
  m_stageLayers.clear();
  // An invalid model section has meaningless sizes: no layers are named then.
  const bool modelValid = m_doc->errorsAt(QStringLiteral("/model")).empty();
  const auto placement =
      modelValid ? layerPlacement(config) : Expected<LayerPlacement>(Status::error("invalid model"));
  if (placement && config.parallel.pp >= 1) {
    const std::vector<std::string> names = modelLayerNames(config.model);
    std::vector<std::vector<std::vector<std::string>>> chunks(static_cast<size_t>(config.parallel.pp));
    int lastChunk = -1;
    for (size_t i = 0; i < names.size() && i < placement->stageOfLayer.size(); ++i) {
      const int stage = placement->stageOfLayer[i];
      if (stage < 0 || stage >= config.parallel.pp) continue;  // a placement that failed validation
      auto& stageChunks = chunks[static_cast<size_t>(stage)];
      if (placement->chunkOfLayer[i] != lastChunk) stageChunks.emplace_back();
      lastChunk = placement->chunkOfLayer[i];
      stageChunks.back().push_back(names[i]);
    }
    for (const auto& stageChunks : chunks) {
      QStringList parts;
      for (const auto& chunk : stageChunks) parts << shortLayerNames(chunk);
      m_stageLayers << parts.join(QStringLiteral(" + "));
    }
  }

  if (m_selectedNode >= m_geometry.nodeCount()) m_selectedNode = -1;
  if (m_selectedDevice >= m_geometry.deviceCount()) m_selectedDevice = -1;
  m_highlight = -1;
  for (QGraphicsItem* item : m_nodeItems) delete item;
  m_nodeItems.clear();
  m_nodeHeaders.clear();
  for (int n = 0; n < m_geometry.nodeCount(); ++n) {
    const NodeConfig& node = config.mesh.nodes[static_cast<size_t>(n)];
    m_nodeHeaders << tr("%1 · %2 × %3 · %4")
                         .arg(QString::fromStdString(node.name), QString::fromStdString(node.device))
                         .arg(node.count)
                         .arg(m_intraText);
    auto* item = new NodeItem(this, n);
    m_scene->addItem(item);
    m_nodeItems.push_back(item);
  }

  QString summary;
  const ParallelConfig& par = config.parallel;
  if (m_ranks.ok() && par.mode == ParallelMode::ParameterServer) {
    // Servers are host processes: server s on node s mod nodes (plan/ps_model.h).
    // Servers by node (plan/parameter_server.h serverNode), the first few of each.
    QStringList where;
    const size_t nodes = config.mesh.nodes.size();
    std::vector<QStringList> ids(nodes);
    for (int s = 0; s < par.servers; ++s) {
      QStringList& list = ids[static_cast<size_t>(serverNode(config, s))];
      if (list.size() < 4)
        list << QString::number(s);
      else if (list.size() == 4)
        list << QStringLiteral("…");
    }
    for (size_t n = 0; n < nodes && where.size() < 4; ++n)
      if (!ids[n].isEmpty())
        where << tr("%1 on %2")
                     .arg(ids[n].join(QStringLiteral(", ")),
                          QString::fromStdString(config.mesh.nodes[n].name));
    summary = tr("parameter servers: %1 workers (%2) on %3 of %4 devices; servers %5")
                  .arg(par.workers)
                  .arg(QString::fromLatin1(toString(par.consistency)))
                  .arg(m_ranks.layout.world())
                  .arg(m_geometry.deviceCount())
                  .arg(where.join(QStringLiteral("; ")));
  } else if (m_ranks.ok()) {
    const RankLayout& l = m_ranks.layout;
    summary = tr("dp %1 × tp %2 × pp %3 = %4 ranks on %5 devices in %6 %7")
                  .arg(l.dp())
                  .arg(l.tp())
                  .arg(l.pp())
                  .arg(l.world())
                  .arg(m_geometry.deviceCount())
                  .arg(m_geometry.nodeCount())
                  .arg(m_geometry.nodeCount() == 1 ? tr("node") : tr("nodes"));
  } else {
    summary = tr("No rank layout: %1").arg(m_ranks.error);
  }
  const int pp = m_ranks.ok() ? m_ranks.layout.pp() : 0;
  QStringList plain{tr("Inter-node link: %1").arg(m_interText), tr("Intra-node link: %1").arg(m_intraText),
                    summary};
  QString html = QStringLiteral("<p style='margin:0'>%1<br>%2<br>%3</p><table cellspacing='2'>")
                     .arg(plain[0].toHtmlEscaped(), plain[1].toHtmlEscaped(), summary.toHtmlEscaped());
  const auto swatch = [&](const QColor& colour, const QString& text) {
    plain << text;
    html +=
        QStringLiteral("<tr><td style='background-color:%1'>&nbsp;&nbsp;&nbsp;&nbsp;</td><td>%2</td></tr>")
            .arg(colour.name(), text.toHtmlEscaped());
  };
  for (int s = 0; s < pp; ++s) swatch(stageColor(s), tr("stage %1: %2").arg(s).arg(stageLayers(s)));
  swatch(kIdleColor, tr("idle (no rank)"));
  swatch(canvas_detail::kRefuseColor, tr("does not fit its memory"));
  html += QStringLiteral("</table><p style='margin-top:4px'>%1</p>")
              .arg(tr("Tile colour = pipeline stage; dashed outline = tensor-parallel group; a tile split in "
                      "bands holds ranks of several stages.")
                       .toHtmlEscaped());
  m_legendText = plain.join('\n');
  m_legendHtml = html;
  emit legendChanged();

  const QRectF r = m_geometry.sceneRect();
  m_scene->setSceneRect(r.adjusted(-40, -40, 40, 40));
  updateActions();
  if (reshaped && !m_userZoomed) fitAll();
  // A message about an edit holds only for the state it described (see hideMessage's callers).
  if (m_message->isVisible() && m_doc->revision() != m_messageRevision) hideMessage();
  placeOverlays();
  viewport()->update();
}

QString MeshCanvas::nodeHeader(int node) const {
  return node >= 0 && node < m_nodeHeaders.size() ? m_nodeHeaders[node] : QString();
}

int MeshCanvas::tileLinesShown() const {
  const double scale = transform().m11();
  const QSizeF tile = m_geometry.params().tile;
  if (tile.width() * scale < canvas_detail::kOutlinedTilePx) return 0;
  const QSizeF text((tile.width() - 2 * canvas_detail::kTileTextMarginX) * scale,
                    (tile.height() - 2 * canvas_detail::kTileTextMarginY) * scale);
  return canvas_detail::linesThatFit(text, font(), 3);
}

QString MeshCanvas::nodeShortName(int node) const {
  const auto& nodes = m_doc->config().mesh.nodes;
  return node >= 0 && node < static_cast<int>(nodes.size())
             ? QString::fromStdString(nodes[static_cast<size_t>(node)].name)
             : QString();
}

QString MeshCanvas::stageLayers(int stage) const {
  return stage >= 0 && stage < m_stageLayers.size() ? m_stageLayers[stage] : QString();
}

int MeshCanvas::stageOfDevice(int device) const {
  const int rank = m_ranks.firstRank(device);
  return rank < 0 ? -1 : m_ranks.layout.coord(rank).pp;
}

std::vector<int> MeshCanvas::stagesOfDevice(int device) const {
  std::vector<int> stages;
  if (device < 0 || device >= static_cast<int>(m_ranks.ranksOnDevice.size())) return stages;
  for (int r : m_ranks.ranksOnDevice[static_cast<size_t>(device)]) {
    const int s = m_ranks.layout.coord(r).pp;
    if (std::find(stages.begin(), stages.end(), s) == stages.end()) stages.push_back(s);
  }
  std::sort(stages.begin(), stages.end());
  return stages;
}

QColor MeshCanvas::stageColor(int stage) {
  // Golden-ratio hue steps: neighbouring stages get distant hues for any pp.
  const double hue = std::fmod(0.08 + stage * 0.618033988749895, 1.0);
  return QColor::fromHsvF(float(hue), 0.42f, 0.97f);
}

QColor MeshCanvas::tileColor(int device) const {
  const int stage = stageOfDevice(device);
  return stage < 0 ? kIdleColor : stageColor(stage);
}

bool MeshCanvas::deviceFits(int device) const {
  const int rank = m_ranks.firstRank(device);
  if (rank < 0 || rank >= static_cast<int>(m_memory.size())) return true;
  const auto& ranks = m_ranks.ranksOnDevice[static_cast<size_t>(device)];
  // Ranks sharing a device share its memory.
  double total = 0;
  for (int r : ranks) total += m_memory[static_cast<size_t>(r)].total();
  return total <= m_memory[static_cast<size_t>(rank)].capacity;
}

bool MeshCanvas::highlightAcceptable() const {
  return stageOfDevice(m_highlight) >= 0;
}

QString MeshCanvas::tileLabel(int device) const {
  if (device < 0 || device >= m_geometry.deviceCount()) return {};
  const int rank = m_ranks.firstRank(device);
  if (rank < 0) return tr("device %1\n%2").arg(device).arg(m_ranks.ok() ? tr("idle") : tr("no layout"));
  const auto& ranks = m_ranks.ranksOnDevice[static_cast<size_t>(device)];
  const RankCoord c = m_ranks.layout.coord(rank);
  if (m_doc->config().parallel.mode == ParallelMode::ParameterServer)
    return tr("worker %1\nwhole model\npulls, pushes").arg(rank);
  if (ranks.size() == 1)
    return tr("rank %1 · stage %2\ntp %3 · dp %4\n%5")
        .arg(rank)
        .arg(c.pp)
        .arg(c.tp)
        .arg(c.dp)
        .arg(stageLayers(c.pp));
  // Ranks sharing the device: every rank's stage is named, as the tile's bands show them.
  QStringList list;
  for (size_t i = 0; i < std::min<size_t>(4, ranks.size()); ++i) list << QString::number(ranks[i]);
  const std::vector<int> stages = stagesOfDevice(device);
  QStringList stageList, layers;
  for (int s : stages) {
    stageList << QString::number(s);
    layers << stageLayers(s);
  }
  return tr("ranks %1%2 · %3 %4\n%5")
      .arg(list.join(QStringLiteral(",")))
      .arg(ranks.size() > 4 ? QStringLiteral("…") : QString())
      .arg(stages.size() == 1 ? tr("stage") : tr("stages"))
      .arg(stageList.join(QStringLiteral(",")))
      .arg(layers.join(QStringLiteral(" | ")));
}

// The groups a rank talks in (plan/layout.h): each as its ranks, the first few and the count past them.
QString MeshCanvas::groupsText(int rank) const {
  const RankLayout& L = m_ranks.layout;
  auto list = [](const std::vector<int>& g) {
    QStringList out;
    for (size_t i = 0; i < g.size() && i < 6; ++i) out << QString::number(g[i]);
    if (g.size() > 6) out << QObject::tr("… (%1 ranks)").arg(g.size());
    return out.join(QStringLiteral(", "));
  };
  QString text;
  if (L.tp() > 1) text += tr("\n  tensor-parallel group: %1").arg(list(L.tpGroup(rank)));
  if (L.cp() > 1) {
    // The rank's two chunks of every sequence (positions), ring attention's ring.
    const RankCoord c = L.coord(rank);
    const int T = m_doc->config().training.seqLen, chunk = T / (2 * L.cp());
    const int second = (2 * L.cp() - 1 - c.cp) * chunk;
    text += tr("\n  context-parallel ring: %1; positions %2-%3 and %4-%5 of %6")
                .arg(list(L.cpGroup(rank)))
                .arg(c.cp * chunk)
                .arg(c.cp * chunk + chunk - 1)
                .arg(second)
                .arg(second + chunk - 1)
                .arg(T);
  }
  if (L.dp() > 1) text += tr("\n  data-parallel group: %1").arg(list(L.dpGroup(rank)));
  if (L.cp() > 1 && L.dp() > 1) text += tr("\n  gradient group (dp x cp): %1").arg(list(L.dpCpGroup(rank)));
  if (L.pp() > 1) text += tr("\n  pipeline: %1").arg(list(L.ppGroup(rank)));
  if (L.ep() > 1) {
    const RankCoord c = L.coord(rank);
    const int experts = m_doc->config().model.experts, per = experts / L.ep(), first = L.epRank(c) * per;
    text += tr("\n  expert-parallel group (all-to-all): %1; experts %2-%3 of %4")
                .arg(list(L.epGroup(rank)))
                .arg(first)
                .arg(first + per - 1)
                .arg(experts);
    if (L.edp() > 1) text += tr("\n  the same experts' replicas: %1").arg(list(L.edpGroup(rank)));
  }
  return text;
}

QString MeshCanvas::tileToolTip(int device) const {
  const int node = m_geometry.nodeOfDevice(device);
  if (node < 0) return {};
  const RunConfig& config = m_doc->config();
  const NodeConfig& n = config.mesh.nodes[static_cast<size_t>(node)];
  QString text = tr("Device %1 (#%2 of %3)")
                     .arg(device)
                     .arg(m_geometry.localIndex(device))
                     .arg(QString::fromStdString(n.name));
  if (const auto spec = deviceSpec(config.mesh, n.device)) {
    text += tr("\n%1: %2 TFLOP/s bf16, %3 TFLOP/s fp32, %4")
                .arg(QString::fromStdString(spec->label))
                .arg(spec->peakFlopsBf16 / 1e12, 0, 'g', 4)
                .arg(spec->peakFlopsFp32 / 1e12, 0, 'g', 4)
                .arg(formatBytes(spec->memoryBytes));
    // How the planner costs its compute (cost_model.cpp): by shape on a catalog GPU, else one fraction.
    if (const auto& k = spec->kernels)
      text += tr("\n  costed by shape: GEMMs up to %1 TFLOP/s bf16 in waves over %2 SMs (%3); attention, "
                 "elementwise passes and the optimizer at fractions measured on an H100")
                  .arg(k->gemmEfficiency * spec->peakFlopsBf16 / 1e12, 0, 'f', 1)
                  .arg(k->sms)
                  .arg(QString::fromStdString(k->source));
    else
      text +=
          tr("\n  costed at %1% of the peak for every FLOP").arg(100 * spec->achievableFraction, 0, 'g', 3);
  }
  const int rank = m_ranks.firstRank(device);
  if (rank < 0) return text + tr("\nIdle: no rank runs here (drops are refused)");
  const bool ps = config.parallel.mode == ParallelMode::ParameterServer;
  for (int r : m_ranks.ranksOnDevice[static_cast<size_t>(device)]) {
    const RankCoord c = m_ranks.layout.coord(r);
    if (ps)
      text += tr("\nWorker %1: the whole model, pulling from and pushing to %2 server(s)")
                  .arg(r)
                  .arg(config.parallel.servers);
    else
      text += tr("\nRank %1: stage %2, tp %3, dp %4").arg(r).arg(c.pp).arg(c.tp).arg(c.dp) +
              (m_ranks.layout.cp() > 1 ? tr(", cp %1").arg(c.cp) : QString()) + groupsText(r);
    if (r < static_cast<int>(m_memory.size())) {
      const MemoryBreakdown& m = m_memory[static_cast<size_t>(r)];
      text += tr("\n  memory %1 of %2 (parameters %3, gradients %4, optimizer %5, activations %6, other %7)")
                  .arg(formatBytes(m.total()), formatBytes(m.capacity), formatBytes(m.parameters),
                       formatBytes(m.gradients), formatBytes(m.optimizer), formatBytes(m.activations),
                       formatBytes(m.other));
      if (m.host.total() > 0) text += tr("\n  host memory (offload) %1").arg(formatBytes(m.host.total()));
    }
  }
  for (int s : stagesOfDevice(device)) text += tr("\nLayers of stage %1: %2").arg(s).arg(stageLayers(s));
  if (!deviceFits(device)) text += tr("\nDoes not fit in the device's memory");
  return text;
}

QString MeshCanvas::messageText() const {
  return static_cast<OverlayItem*>(m_message)->text();
}

bool MeshCanvas::messageVisible() const {
  return m_message->isVisible();
}

void MeshCanvas::setSnapshot(std::shared_ptr<const PlanSnapshot> snapshot) {
  if (!snapshot || !(snapshot->config == m_doc->config())) return;
  m_memory = snapshot->ok() ? snapshot->memory : std::vector<MemoryBreakdown>{};
  for (QGraphicsItem* item : m_nodeItems) item->update();
}

// --- Edits ---

bool MeshCanvas::refuse(const QString& reason) {
  m_lastRefusal = reason;
  showMessage(reason, true);
  emit dropRefused(reason);
  return false;
}

void MeshCanvas::showMessage(const QString& text, bool error) {
  auto* message = static_cast<OverlayItem*>(m_message);
  message->setText(text, error ? kRefuseColor : QColor(56, 142, 60),
                   error ? QColor(255, 235, 238, 240) : QColor(232, 245, 233, 240), font());
  message->setVisible(true);
  m_messageRevision = m_doc->revision();
  placeOverlays();
  m_messageTimer->start(kMessageMillis);
}

void MeshCanvas::hideMessage() {
  m_messageTimer->stop();
  m_message->setVisible(false);
}

void MeshCanvas::selectDevice(int device) {
  if (device >= m_geometry.deviceCount()) device = -1;
  m_selectedDevice = device;
  m_selectedNode = device < 0 ? m_selectedNode : m_geometry.nodeOfDevice(device);
  updateActions();
  for (QGraphicsItem* item : m_nodeItems) item->update();
  emit selectionChanged(m_selectedNode, m_selectedDevice);
}

void MeshCanvas::selectNode(int node) {
  if (node >= m_geometry.nodeCount()) node = -1;
  m_selectedNode = node;
  m_selectedDevice = -1;
  updateActions();
  for (QGraphicsItem* item : m_nodeItems) item->update();
  emit selectionChanged(m_selectedNode, m_selectedDevice);
}

void MeshCanvas::updateDevice(int device) {
  const int node = m_geometry.nodeOfDevice(device);
  if (node >= 0 && node < int(m_nodeItems.size())) m_nodeItems[static_cast<size_t>(node)]->update();
}

void MeshCanvas::setHighlight(int device) {
  if (device == m_highlight) return;
  updateDevice(m_highlight);
  m_highlight = device;
  updateDevice(m_highlight);
}

void MeshCanvas::setFitMode(bool fit) {
  m_userZoomed = !fit;
  // Fitted, the mesh is inside the viewport by construction: scroll bars could only appear and disappear as
  // the fit rounds, each time resizing the viewport, which refits (the loop that froze the window).
  const Qt::ScrollBarPolicy policy = fit ? Qt::ScrollBarAlwaysOff : Qt::ScrollBarAsNeeded;
  if (horizontalScrollBarPolicy() != policy) setHorizontalScrollBarPolicy(policy);
  if (verticalScrollBarPolicy() != policy) setVerticalScrollBarPolicy(policy);
}

void MeshCanvas::zoomIn() {
  const double s = transform().m11();
  setFitMode(false);
  if (s * 1.25 <= kMaxScale) scale(1.25, 1.25);
  placeOverlays();
}

void MeshCanvas::zoomOut() {
  const double s = transform().m11();
  setFitMode(false);
  if (s * 0.8 >= kMinScale) scale(0.8, 0.8);
  placeOverlays();
}

void MeshCanvas::fitAll() {
  setFitMode(true);
  if (m_geometry.nodeCount() == 0) return;
  const QRectF target = m_geometry.sceneRect().adjusted(-20, -20, 20, 20);
  const QRect area = viewport()->rect().adjusted(2, 2, -2, -2);
  if (area.width() < 1 || area.height() < 1) return;
  double s = std::min(area.width() / target.width(), area.height() / target.height());
  s = std::clamp(s, kMinScale, kMaxFitScale);
  setTransform(QTransform::fromScale(s, s));
  centerOn(target.center());
  placeOverlays();
}

void MeshCanvas::placeOverlays() {
  if (m_message) m_message->setPos(mapToScene(QPoint(kOverlayMargin, kOverlayMargin)));
}

void MeshCanvas::wheelEvent(QWheelEvent* event) {
  if (!(event->modifiers() & Qt::ControlModifier)) return QGraphicsView::wheelEvent(event);
  const double factor = std::pow(1.0015, event->angleDelta().y());
  const double s = transform().m11() * factor;
  setFitMode(false);
  if (s >= kMinScale && s <= kMaxScale) scale(factor, factor);
  placeOverlays();
  event->accept();
}

void MeshCanvas::dragEnterEvent(QDragEnterEvent* event) {
  if (!event->mimeData()->hasFormat(LayerModel::mimeType())) return event->ignore();
  setHighlight(m_geometry.deviceAt(mapToScene(event->position().toPoint())));
  event->acceptProposedAction();
}

void MeshCanvas::dragMoveEvent(QDragMoveEvent* event) {
  if (!event->mimeData()->hasFormat(LayerModel::mimeType())) return event->ignore();
  // Accepted everywhere, so a drop on empty space or an idle device arrives and is refused with a reason.
  setHighlight(m_geometry.deviceAt(mapToScene(event->position().toPoint())));
  event->acceptProposedAction();
}

void MeshCanvas::dragLeaveEvent(QDragLeaveEvent* event) {
  setHighlight(-1);
  event->accept();
}

void MeshCanvas::dropEvent(QDropEvent* event) {
  setHighlight(-1);
  const auto range = LayerModel::decodeLayerRange(event->mimeData()->data(LayerModel::mimeType()));
  if (!range) {
    refuse(tr("The dragged data is not a range of layers"));
    return event->ignore();
  }
  const int device = m_geometry.deviceAt(mapToScene(event->position().toPoint()));
  if (dropLayers(range->first, range->second, device)) {
    event->setDropAction(Qt::CopyAction);  // the palette keeps its rows
    event->accept();
  } else {
    event->ignore();
  }
}

void MeshCanvas::mousePressEvent(QMouseEvent* event) {
  const QPointF pos = mapToScene(event->position().toPoint());
  const int device = m_geometry.deviceAt(pos);
  const int node = m_geometry.nodeAt(pos);
  // Pan by dragging anywhere but a tile (a press on a node's box selects the node and still pans).
  setDragMode(device < 0 ? ScrollHandDrag : NoDrag);
  QGraphicsView::mousePressEvent(event);
  if (event->button() == Qt::LeftButton && node >= 0) {
    if (device >= 0)
      selectDevice(device);
    else
      selectNode(node);
    event->accept();  // the scene's items take no clicks; the canvas did
  }
}

void MeshCanvas::keyPressEvent(QKeyEvent* event) {
  if (event->matches(QKeySequence::Delete) && m_selectedDevice < 0 && m_selectedNode >= 0) {
    removeNode(m_selectedNode);
    return;
  }
  QGraphicsView::keyPressEvent(event);
}

void MeshCanvas::contextMenuEvent(QContextMenuEvent* event) {
  const QPointF pos = mapToScene(event->pos());
  const int device = m_geometry.deviceAt(pos);
  const int node = m_geometry.nodeAt(pos);
  if (device >= 0)
    selectDevice(device);
  else if (node >= 0)
    selectNode(node);
  QMenu menu(this);
  if (device >= 0) menu.addAction(m_removeDevice);
  if (node >= 0) {
    menu.addAction(m_addDevice);
    menu.addAction(m_duplicateNode);
    menu.addAction(m_removeNode);
    QMenu* types = menu.addMenu(tr("Device type"));
    fillDeviceTypeMenu(types, node);
    if (m_doc->config().parallel.mode == ParallelMode::ParameterServer) {
      menu.addAction(tr("Add a Parameter Server Here"), this, [this, node] { addServer(node); });
      menu.addAction(tr("Remove a Parameter Server from Here"), this, [this, node] { removeServer(node); });
    }
    menu.addSeparator();
  }
  menu.addAction(m_addNode);
  menu.addAction(m_links);
  menu.addSeparator();
  menu.addAction(m_fit);
  menu.exec(event->globalPos());
}

bool MeshCanvas::viewportEvent(QEvent* event) {
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    const QPointF pos = mapToScene(help->pos());
    const int device = m_geometry.deviceAt(pos);
    const int node = m_geometry.nodeAt(pos);
    QString text;
    if (device >= 0) {
      text = tileToolTip(device);
    } else if (node >= 0) {
      text = nodeHeader(node);
    }
    if (text.isEmpty())
      QToolTip::hideText();
    else
      QToolTip::showText(help->globalPos(), text, viewport());
    return true;
  }
  return QGraphicsView::viewportEvent(event);
}

void MeshCanvas::scrollContentsBy(int dx, int dy) {
  QGraphicsView::scrollContentsBy(dx, dy);
  placeOverlays();
}

void MeshCanvas::resizeEvent(QResizeEvent* event) {
  QGraphicsView::resizeEvent(event);
  // Fitted, the view has no scroll bars (setFitMode), so this refit cannot resize the viewport again.
  if (!m_userZoomed && event->size() != event->oldSize()) fitAll();
  placeOverlays();
}

void MeshCanvas::showEvent(QShowEvent* event) {
  QGraphicsView::showEvent(event);
  if (!m_userZoomed) fitAll();
}

}  // namespace ms
