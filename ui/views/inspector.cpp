// Inspector; see inspector.h.
#include "ui/views/inspector.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QLabel>
#include <QLineEdit>
#include <QScrollArea>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QVBoxLayout>
#include <climits>
#include <cmath>

#include "plan/config_schema.h"
#include "ui/models/project_document.h"

namespace ms {

namespace {

// Merge keys of the inspector's fields: this base plus the field's index. Far from small numbers so other
// views' keys do not collide with them.
constexpr int kMergeKeyBase = 0x1d5e0000;

const QString kErrorStyle = QStringLiteral("color: #d32f2f");

// The schema node of a field path: "/parallel/tp" -> properties.parallel.properties.tp; a numeric last
// segment is an array item ("/optimizer/betas/0" -> properties.optimizer.properties.betas.items).
nlohmann::json schemaAt(const nlohmann::json& schema, const QString& path) {
  const nlohmann::json* node = &schema;
  for (const QString& part : path.split('/', Qt::SkipEmptyParts)) {
    bool isIndex = false;
    part.toInt(&isIndex);
    const char* key = isIndex ? "items" : "properties";
    if (isIndex) {
      if (!node->contains(key)) return {};
      node = &(*node)[key];
      continue;
    }
    if (!node->contains(key) || !(*node)[key].contains(part.toStdString())) return {};
    node = &(*node)[key][part.toStdString()];
  }
  return *node;
}

double bound(const nlohmann::json& s, const char* inclusive, const char* exclusive, double fallback) {
  if (s.contains(inclusive) && s[inclusive].is_number()) return s[inclusive].get<double>();
  if (s.contains(exclusive) && s[exclusive].is_number()) return s[exclusive].get<double>();
  return fallback;
}

bool owns(const QString& owner, const std::string& errorPath) {
  const std::string p = owner.toStdString();
  return errorPath == p || (errorPath.size() > p.size() && errorPath.compare(0, p.size(), p) == 0 &&
                            errorPath[p.size()] == '/');
}

void markInvalid(QWidget* editor, bool invalid) {
  editor->setStyleSheet(invalid ? QStringLiteral("%1 { border: 2px solid #d32f2f; border-radius: 3px; }")
                                      .arg(QString::fromLatin1(editor->metaObject()->className()))
                                : QString());
}

constexpr int kEditorMinWidth = 64;  // pixels: five digits, or a short choice, at the UI font

// An enum field's combo items and the value an item names, from the config schema's table of JSON names
// (plan/config_schema.h), so the inspector keeps no list of its own.
template <typename E, size_t N>
QStringList enumNames(const EnumName<E> (&table)[N]) {
  QStringList names;
  for (const EnumName<E>& e : table) names << QString::fromLatin1(e.name);
  return names;
}
template <typename E, size_t N>
void setEnum(E& field, const EnumName<E> (&table)[N], const QString& name) {
  for (const EnumName<E>& e : table)
    if (name == QLatin1String(e.name)) field = e.value;
}

}  // namespace

Inspector::Inspector(ProjectDocument* doc, QWidget* parent)
    : QWidget(parent), m_doc(doc), m_schema(runConfigSchema()) {
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(0, 0, 0, 0);
  auto* scroll = new QScrollArea(this);
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);  // the form fits the dock's width
  outer->addWidget(scroll);
  auto* content = new QWidget(scroll);
  m_sections = new QVBoxLayout(content);
  m_general = makeMessageLabel(content);
  m_sections->addWidget(m_general);
  scroll->setWidget(content);
  m_fields.reserve(40);

  QFormLayout* run = addSection(tr("Run"), QString());
  addText(
      run, "/name", tr("Name"), [](const RunConfig& c) { return QString::fromStdString(c.name); },
      [](RunConfig& c, const QString& v) { c.name = v.toStdString(); });
  addChoice(
      run, "/device", tr("Device"), enumNames(kDeviceChoiceNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.device)); },
      [](RunConfig& c, const QString& v) { setEnum(c.device, kDeviceChoiceNames, v); });

  QFormLayout* par = addSection(tr("Parallel layout"), "/parallel");
  addInt(
      par, "/parallel/dp", tr("Data parallel (dp)"), [](const RunConfig& c) { return c.parallel.dp; },
      [](RunConfig& c, int v) { c.parallel.dp = v; });
  addInt(
      par, "/parallel/tp", tr("Tensor parallel (tp)"), [](const RunConfig& c) { return c.parallel.tp; },
      [](RunConfig& c, int v) { c.parallel.tp = v; });
  addInt(
      par, "/parallel/cp", tr("Context parallel (cp)"), [](const RunConfig& c) { return c.parallel.cp; },
      [](RunConfig& c, int v) { c.parallel.cp = v; });
  addInt(
      par, "/parallel/ep", tr("Expert parallel (ep)"), [](const RunConfig& c) { return c.parallel.ep; },
      [](RunConfig& c, int v) { c.parallel.ep = v; });
  // A placement names stages and counts chunks: a new pp or chunk count makes it wrong, so it goes back to
  // the even split (the palette's Balance or a drop makes a new one).
  addInt(
      par, "/parallel/pp", tr("Pipeline stages (pp)"), [](const RunConfig& c) { return c.parallel.pp; },
      [](RunConfig& c, int v) {
        c.parallel.pp = v;
        c.parallel.placement.clear();
      });
  addChoice(
      par, "/parallel/schedule", tr("Schedule"), enumNames(kScheduleNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.parallel.schedule)); },
      [](RunConfig& c, const QString& v) { setEnum(c.parallel.schedule, kScheduleNames, v); });
  addInt(
      par, "/parallel/microbatches", tr("Microbatches"),
      [](const RunConfig& c) { return c.parallel.microbatches; },
      [](RunConfig& c, int v) { c.parallel.microbatches = v; });
  addInt(
      par, "/parallel/virtual_chunks", tr("Virtual chunks"),
      [](const RunConfig& c) { return c.parallel.virtualChunks; },
      [](RunConfig& c, int v) {
        c.parallel.virtualChunks = v;
        c.parallel.placement.clear();
      });
  addInt(
      par, "/parallel/zero", tr("ZeRO stage"), [](const RunConfig& c) { return c.parallel.zero; },
      [](RunConfig& c, int v) {
        c.parallel.zero = v;
        // Only ZeRO 1-2 gather the parameters after the step (config_checks refuses the overlap elsewhere).
        if (v != 1 && v != 2) c.parallel.overlapParamGather = false;
      });
  addChoice(
      par, "/parallel/precision", tr("Precision"), enumNames(kPrecisionNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.parallel.precision)); },
      [](RunConfig& c, const QString& v) { setEnum(c.parallel.precision, kPrecisionNames, v); });
  addChoice(
      par, "/parallel/grad_precision", tr("Gradient precision"), enumNames(kGradPrecisionNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.parallel.gradPrecision)); },
      [](RunConfig& c, const QString& v) { setEnum(c.parallel.gradPrecision, kGradPrecisionNames, v); });
  addChoice(
      par, "/parallel/offload", tr("Offload"), enumNames(kOffloadNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.parallel.offload)); },
      [](RunConfig& c, const QString& v) { setEnum(c.parallel.offload, kOffloadNames, v); });
  addChoice(
      par, "/parallel/recompute", tr("Recompute"), enumNames(kRecomputeNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.parallel.recompute)); },
      [](RunConfig& c, const QString& v) {
        setEnum(c.parallel.recompute, kRecomputeNames, v);
        // A count of fully recomputed blocks means nothing without "full" (config_checks refuses it).
        if (c.parallel.recompute != Recompute::Full) c.parallel.recomputeLayers = 0;
      });
  addInt(
      par, "/parallel/recompute_layers", tr("Recomputed blocks"),
      [](const RunConfig& c) { return c.parallel.recomputeLayers; },
      [](RunConfig& c, int v) { c.parallel.recomputeLayers = v; });
  addBool(
      par, "/parallel/sequence_parallel", tr("Sequence parallel"),
      [](const RunConfig& c) { return c.parallel.sequenceParallel; },
      [](RunConfig& c, bool v) {
        c.parallel.sequenceParallel = v;
        // The collectives the overlap splits are sequence parallelism's (config_checks refuses it without).
        if (!v) c.parallel.tpCommOverlap = false;
      });
  addBool(
      par, "/parallel/tp_comm_overlap", tr("Overlap TP communication"),
      [](const RunConfig& c) { return c.parallel.tpCommOverlap; },
      [](RunConfig& c, bool v) { c.parallel.tpCommOverlap = v; });
  addBool(
      par, "/parallel/overlap_param_gather", tr("Overlap parameter gather"),
      [](const RunConfig& c) { return c.parallel.overlapParamGather; },
      [](RunConfig& c, bool v) { c.parallel.overlapParamGather = v; });
  addChoice(
      par, "/parallel/batchnorm", tr("BatchNorm"), enumNames(kBatchNormModeNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.parallel.batchNorm)); },
      [](RunConfig& c, const QString& v) { setEnum(c.parallel.batchNorm, kBatchNormModeNames, v); });

  // Parameter-server mode (runtime/ps.h): switching modes carries the replica count across (dp <-> workers)
  // and resets what the other mode does not run, so that the switch makes a valid plan.
  QFormLayout* ps = addSection(tr("Parameter servers"), QString());
  addChoice(
      ps, "/parallel/mode", tr("Mode"), enumNames(kParallelModeNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.parallel.mode)); },
      [](RunConfig& c, const QString& v) {
        const ParallelMode before = c.parallel.mode;
        setEnum(c.parallel.mode, kParallelModeNames, v);
        ParallelConfig& p = c.parallel;
        if (before == p.mode) return;
        if (p.mode == ParallelMode::ParameterServer) {
          p.workers = std::max(1, p.dp);
          p.dp = p.tp = p.pp = 1;
          p.zero = 0;
          p.virtualChunks = 1;
          p.offload = Offload::None;
          p.gradPrecision = GradPrecision::Fp32;
          p.sequenceParallel = false;
          p.tpCommOverlap = false;
          p.overlapParamGather = false;
          p.batchNorm = BatchNormMode::Local;
          p.placement.clear();
          if (p.servers > 1) c.training.gradClip = 0;
        } else {
          p.dp = std::max(1, p.workers);
          p.workers = p.servers = 1;
          p.stragglers.clear();
        }
      });
  addInt(
      ps, "/parallel/servers", tr("Servers"), [](const RunConfig& c) { return c.parallel.servers; },
      [](RunConfig& c, int v) { c.parallel.servers = v; });
  addInt(
      ps, "/parallel/workers", tr("Workers"), [](const RunConfig& c) { return c.parallel.workers; },
      [](RunConfig& c, int v) { c.parallel.workers = v; });
  addChoice(
      ps, "/parallel/consistency", tr("Consistency"), enumNames(kConsistencyNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.parallel.consistency)); },
      [](RunConfig& c, const QString& v) { setEnum(c.parallel.consistency, kConsistencyNames, v); });
  addInt(
      ps, "/parallel/staleness", tr("Staleness bound"),
      [](const RunConfig& c) { return c.parallel.staleness; },
      [](RunConfig& c, int v) { c.parallel.staleness = v; });

  QFormLayout* opt = addSection(tr("Optimizer"), "/optimizer");
  addChoice(
      opt, "/optimizer/type", tr("Type"), enumNames(kOptimizerTypeNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.optimizer.type)); },
      [](RunConfig& c, const QString& v) { setEnum(c.optimizer.type, kOptimizerTypeNames, v); });
  addNumberText(
      opt, "/optimizer/lr", tr("Learning rate"), [](const RunConfig& c) { return c.optimizer.lr; },
      [](RunConfig& c, double v) { c.optimizer.lr = v; });
  addDouble(
      opt, "/optimizer/betas/0", tr("Beta 1"), 4, [](const RunConfig& c) { return c.optimizer.beta1; },
      [](RunConfig& c, double v) { c.optimizer.beta1 = v; });
  m_fields.back().owns << "/optimizer/betas";  // errors about the pair as a whole
  addDouble(
      opt, "/optimizer/betas/1", tr("Beta 2"), 4, [](const RunConfig& c) { return c.optimizer.beta2; },
      [](RunConfig& c, double v) { c.optimizer.beta2 = v; });
  addDouble(
      opt, "/optimizer/weight_decay", tr("Weight decay"), 4,
      [](const RunConfig& c) { return c.optimizer.weightDecay; },
      [](RunConfig& c, double v) { c.optimizer.weightDecay = v; });
  addDouble(
      opt, "/optimizer/momentum", tr("Momentum"), 3, [](const RunConfig& c) { return c.optimizer.momentum; },
      [](RunConfig& c, double v) { c.optimizer.momentum = v; });

  QFormLayout* train = addSection(tr("Training"), "/training");
  addInt(
      train, "/training/steps", tr("Steps"), [](const RunConfig& c) { return c.training.steps; },
      [](RunConfig& c, int v) { c.training.steps = v; });
  addInt(
      train, "/training/batch_size", tr("Batch size"),
      [](const RunConfig& c) { return c.training.batchSize; },
      [](RunConfig& c, int v) { c.training.batchSize = v; });
  addInt(
      train, "/training/seq_len", tr("Sequence length"), [](const RunConfig& c) { return c.training.seqLen; },
      [](RunConfig& c, int v) { c.training.seqLen = v; });
  addInt(
      train, "/training/warmup_steps", tr("Warm-up steps"),
      [](const RunConfig& c) { return c.training.warmupSteps; },
      [](RunConfig& c, int v) { c.training.warmupSteps = v; });
  addChoice(
      train, "/training/lr_schedule", tr("LR schedule"), enumNames(kLrScheduleNames),
      [](const RunConfig& c) { return QString::fromLatin1(toString(c.training.lrSchedule)); },
      [](RunConfig& c, const QString& v) { setEnum(c.training.lrSchedule, kLrScheduleNames, v); });
  addInt(
      train, "/training/eval_every", tr("Evaluate every"),
      [](const RunConfig& c) { return c.training.evalEvery; },
      [](RunConfig& c, int v) { c.training.evalEvery = v; });
  addInt(
      train, "/training/checkpoint_every", tr("Checkpoint every"),
      [](const RunConfig& c) { return c.training.checkpointEvery; },
      [](RunConfig& c, int v) { c.training.checkpointEvery = v; });
  addInt(
      train, "/training/threads", tr("Threads per rank"),
      [](const RunConfig& c) { return c.training.threads; },
      [](RunConfig& c, int v) { c.training.threads = v; });
  m_sections->addStretch(1);

  connect(doc, &ProjectDocument::configChanged, this, [this] {
    // The document moved (an edit, undo, load): a half-typed number elsewhere gives way to its value.
    m_localErrors.clear();
    refresh();
  });
  refresh();
}

QLabel* Inspector::makeMessageLabel(QWidget* parent) {
  auto* label = new QLabel(parent);
  label->setStyleSheet(kErrorStyle);
  label->setWordWrap(true);
  label->setTextInteractionFlags(Qt::TextSelectableByMouse);
  label->setVisible(false);
  return label;
}

QFormLayout* Inspector::addSection(const QString& title, const QString& path) {
  auto* box = new QGroupBox(title, m_sections->parentWidget());
  auto* outer = new QVBoxLayout(box);
  if (!path.isEmpty()) {
    Field section;
    section.path = path;
    section.owns << path;
    section.message = makeMessageLabel(box);
    outer->addWidget(section.message);
    m_sectionFields.push_back(section);
  }
  auto* form = new QFormLayout;
  form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  outer->addLayout(form);
  m_sections->addWidget(box);
  return form;
}

Inspector::Field& Inspector::addRow(QFormLayout* form, const QString& path, const QString& label,
                                    QWidget* editor) {
  auto* cell = new QWidget(form->parentWidget());
  auto* column = new QVBoxLayout(cell);
  column->setContentsMargins(0, 0, 0, 0);
  column->setSpacing(1);
  editor->setParent(cell);
  // A spin box sizes itself for the largest value of its range (ten digits for a count of steps); the
  // inspector is a narrow dock, so editors take the width the form gives them, not more.
  editor->setMinimumWidth(kEditorMinWidth);
  column->addWidget(editor);
  Field f;
  f.path = path;
  f.owns << path;
  f.editor = editor;
  f.message = makeMessageLabel(cell);
  column->addWidget(f.message);
  editor->setObjectName(path);  // findable by path, e.g. in a UI test's findChild
  const nlohmann::json s = schemaAt(m_schema, path);
  QString tip =
      s.contains("description") ? QString::fromStdString(s["description"].get<std::string>()) : QString();
  if (tip.isEmpty()) {  // an array item: describe the array
    const nlohmann::json parent = schemaAt(m_schema, path.section('/', 0, -2));
    if (parent.contains("description"))
      tip = QString::fromStdString(parent["description"].get<std::string>());
  }
  editor->setToolTip(QStringLiteral("%1\n%2").arg(path.mid(1).replace('/', '.'), tip));
  form->addRow(label, cell);
  m_fields.push_back(f);
  return m_fields.back();
}

void Inspector::write(const QString& path, const std::function<void(RunConfig&)>& change) {
  m_doc->edit(tr("Edit %1").arg(path.mid(1).replace('/', '.')), change, mergeKeyOf(path));
}

int Inspector::mergeKeyOf(const QString& path) const {
  for (size_t i = 0; i < m_fields.size(); ++i)
    if (m_fields[i].path == path) return kMergeKeyBase + static_cast<int>(i);
  return -1;
}

void Inspector::addInt(QFormLayout* form, const QString& path, const QString& label,
                       std::function<int(const RunConfig&)> get, std::function<void(RunConfig&, int)> set) {
  auto* spin = new QSpinBox;
  const nlohmann::json s = schemaAt(m_schema, path);
  spin->setRange(int(bound(s, "minimum", "exclusiveMinimum", 0)),
                 int(std::min<double>(INT_MAX, bound(s, "maximum", "exclusiveMaximum", INT_MAX))));
  spin->setAccelerated(true);
  Field& f = addRow(form, path, label, spin);
  f.load = [spin, get](const RunConfig& c) { spin->setValue(get(c)); };
  connect(spin, &QSpinBox::valueChanged, this,
          [this, path, set](int v) { write(path, [&](RunConfig& c) { set(c, v); }); });
}

void Inspector::addDouble(QFormLayout* form, const QString& path, const QString& label, int decimals,
                          std::function<double(const RunConfig&)> get,
                          std::function<void(RunConfig&, double)> set) {
  auto* spin = new QDoubleSpinBox;
  const nlohmann::json s = schemaAt(m_schema, path);
  spin->setDecimals(decimals);
  spin->setRange(bound(s, "minimum", "exclusiveMinimum", 0), bound(s, "maximum", "exclusiveMaximum", 1e6));
  spin->setSingleStep(std::pow(10.0, -std::min(decimals, 2)));
  Field& f = addRow(form, path, label, spin);
  f.load = [spin, get](const RunConfig& c) {
    // The spin box rounds to its decimals: leave it alone when it already shows the value, so a refresh does
    // not turn 1e-5 into the 0 it displays.
    if (std::abs(spin->value() - get(c)) > 0.5 * std::pow(10.0, -spin->decimals())) spin->setValue(get(c));
  };
  connect(spin, &QDoubleSpinBox::valueChanged, this,
          [this, path, set](double v) { write(path, [&](RunConfig& c) { set(c, v); }); });
}

void Inspector::addNumberText(QFormLayout* form, const QString& path, const QString& label,
                              std::function<double(const RunConfig&)> get,
                              std::function<void(RunConfig&, double)> set) {
  auto* edit = new QLineEdit;
  Field& f = addRow(form, path, label, edit);
  f.load = [this, edit, get, path](const RunConfig& c) {
    bool ok = false;
    const double shown = edit->text().trimmed().toDouble(&ok);
    if (ok && shown == get(c)) return;  // "2e-3" stays as typed
    // Text being typed that is not a number yet ("2e-") stays too; its message says why nothing changed.
    for (const auto& e : m_localErrors)
      if (e.first == path) return;
    edit->setText(QString::number(get(c), 'g', 8));
  };
  connect(edit, &QLineEdit::textEdited, this, [this, path, set](const QString& text) {
    bool ok = false;
    const double v = text.trimmed().toDouble(&ok);
    std::erase_if(m_localErrors, [&](const auto& e) { return e.first == path; });
    if (!ok || !std::isfinite(v)) {
      m_localErrors.emplace_back(path, tr("\"%1\" is not a number").arg(text));
      refresh();
      return;
    }
    write(path, [&](RunConfig& c) { set(c, v); });
    refresh();  // the local error is gone even when the value did not change
  });
}

void Inspector::addChoice(QFormLayout* form, const QString& path, const QString& label,
                          const QStringList& names, std::function<QString(const RunConfig&)> get,
                          std::function<void(RunConfig&, const QString&)> set) {
  auto* combo = new QComboBox;
  combo->addItems(names);
  Field& f = addRow(form, path, label, combo);
  f.load = [combo, get](const RunConfig& c) { combo->setCurrentIndex(combo->findText(get(c))); };
  connect(combo, &QComboBox::currentTextChanged, this,
          [this, path, set](const QString& v) { write(path, [&](RunConfig& c) { set(c, v); }); });
}

void Inspector::addBool(QFormLayout* form, const QString& path, const QString& label,
                        std::function<bool(const RunConfig&)> get,
                        std::function<void(RunConfig&, bool)> set) {
  auto* check = new QCheckBox;
  Field& f = addRow(form, path, label, check);
  f.load = [check, get](const RunConfig& c) { check->setChecked(get(c)); };
  connect(check, &QCheckBox::toggled, this,
          [this, path, set](bool v) { write(path, [&](RunConfig& c) { set(c, v); }); });
}

void Inspector::addText(QFormLayout* form, const QString& path, const QString& label,
                        std::function<QString(const RunConfig&)> get,
                        std::function<void(RunConfig&, const QString&)> set) {
  auto* edit = new QLineEdit;
  Field& f = addRow(form, path, label, edit);
  f.load = [edit, get](const RunConfig& c) {
    if (edit->text() != get(c)) edit->setText(get(c));
  };
  connect(edit, &QLineEdit::textEdited, this,
          [this, path, set](const QString& v) { write(path, [&](RunConfig& c) { set(c, v); }); });
}

const Inspector::Field* Inspector::find(const QString& path) const {
  for (const Field& f : m_fields)
    if (f.path == path) return &f;
  for (const Field& f : m_sectionFields)
    if (f.path == path) return &f;
  return nullptr;
}

QWidget* Inspector::editorFor(const QString& path) const {
  const Field* f = find(path);
  return f ? f->editor : nullptr;
}

QString Inspector::messageFor(const QString& path) const {
  const Field* f = find(path);
  return f ? f->message->text() : QString();
}

bool Inspector::isMarkedInvalid(const QString& path) const {
  const Field* f = find(path);
  return f && f->invalid;
}

QString Inspector::generalMessage() const {
  return m_general->text();
}

QStringList Inspector::paths() const {
  QStringList out;
  for (const Field& f : m_fields) out << f.path;
  return out;
}

void Inspector::refresh() {
  const RunConfig& config = m_doc->config();
  std::vector<QStringList> messages(m_fields.size());
  std::vector<QStringList> sectionMessages(m_sectionFields.size());
  QStringList general;
  for (const ConfigError& e : m_doc->errors()) {
    const QString text = QString::fromStdString(e.message);
    // The field that owns the most specific path shows it; then its section; else the list at the top.
    int best = -1;
    qsizetype bestLength = -1;
    for (size_t i = 0; i < m_fields.size(); ++i)
      for (const QString& p : m_fields[i].owns)
        if (owns(p, e.path) && p.size() > bestLength) {
          best = static_cast<int>(i);
          bestLength = p.size();
        }
    if (best >= 0) {
      messages[static_cast<size_t>(best)] << text;
      continue;
    }
    bool placed = false;
    for (size_t i = 0; i < m_sectionFields.size() && !placed; ++i)
      if (owns(m_sectionFields[i].path, e.path)) {
        sectionMessages[i] << (e.path == m_sectionFields[i].path.toStdString()
                                   ? text
                                   : QString::fromStdString(e.path) + QStringLiteral(": ") + text);
        placed = true;
      }
    if (!placed) general << QString::fromStdString(e.path) + QStringLiteral(": ") + text;
  }
  for (size_t i = 0; i < m_fields.size(); ++i) {
    Field& f = m_fields[i];
    for (const auto& [path, text] : m_localErrors)
      if (path == f.path) messages[i].prepend(text);
    {
      const QSignalBlocker block(f.editor);
      f.load(config);
    }
    const bool wasInvalid = f.invalid;
    f.invalid = !messages[i].isEmpty();
    f.message->setText(messages[i].join('\n'));
    f.message->setVisible(f.invalid);
    if (f.invalid != wasInvalid) markInvalid(f.editor, f.invalid);  // a style sheet costs a re-polish
  }
  for (size_t i = 0; i < m_sectionFields.size(); ++i) {
    m_sectionFields[i].message->setText(sectionMessages[i].join('\n'));
    m_sectionFields[i].message->setVisible(!sectionMessages[i].isEmpty());
    m_sectionFields[i].invalid = !sectionMessages[i].isEmpty();
  }
  m_general->setText(general.join('\n'));
  m_general->setVisible(!general.isEmpty());
  // Fields one optimizer does not use stay visible (the config keeps them) but cannot be edited.
  const bool adamw = config.optimizer.type == OptimizerType::AdamW;
  for (const char* p : {"/optimizer/betas/0", "/optimizer/betas/1"})
    if (QWidget* w = editorFor(QString::fromLatin1(p))) w->setEnabled(adamw);
  if (QWidget* w = editorFor(QStringLiteral("/optimizer/momentum"))) w->setEnabled(!adamw);
  // Likewise the BatchNorm mode: only the cnn has BatchNorm.
  if (QWidget* w = editorFor(QStringLiteral("/parallel/batchnorm")))
    w->setEnabled(config.model.type == ModelType::Cnn);
  // The parameter-server fields in that mode; the collective layout's in the other.
  const bool ps = config.parallel.mode == ParallelMode::ParameterServer;
  for (const char* p : {"/parallel/servers", "/parallel/workers", "/parallel/consistency"})
    if (QWidget* w = editorFor(QString::fromLatin1(p))) w->setEnabled(ps);
  if (QWidget* w = editorFor(QStringLiteral("/parallel/staleness")))
    w->setEnabled(ps && config.parallel.consistency == Consistency::Bounded);
  for (const char* p :
       {"/parallel/dp", "/parallel/tp", "/parallel/pp", "/parallel/schedule", "/parallel/virtual_chunks",
        "/parallel/zero", "/parallel/offload", "/parallel/sequence_parallel", "/parallel/cp"})
    if (QWidget* w = editorFor(QString::fromLatin1(p))) w->setEnabled(!ps);
  // The overlap of ZeRO 1-2's parameter gather (one left on stays editable, so it can be undone).
  if (QWidget* w = editorFor(QStringLiteral("/parallel/overlap_param_gather")))
    w->setEnabled(!ps && (config.parallel.zero == 1 || config.parallel.zero == 2 ||
                          config.parallel.overlapParamGather));
  // The overlap of the sequence-parallel collectives (one left on stays editable, so it can be undone).
  if (QWidget* w = editorFor(QStringLiteral("/parallel/tp_comm_overlap")))
    w->setEnabled(!ps && (config.parallel.sequenceParallel || config.parallel.tpCommOverlap));
  // Expert parallelism splits a mixture of experts (an ep left above 1 stays editable, so it can be undone).
  if (QWidget* w = editorFor(QStringLiteral("/parallel/ep")))
    w->setEnabled(!ps && ((config.model.type == ModelType::Llama && config.model.experts > 0) ||
                          config.parallel.ep != 1));
}

}  // namespace ms
