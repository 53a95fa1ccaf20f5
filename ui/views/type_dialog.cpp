// TypeDialog; see type_dialog.h.
#include "ui/views/type_dialog.h"

#include <QCheckBox>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QLabel>
#include <QLineEdit>

#include "ui/models/mesh_model.h"

namespace ms {

namespace {
constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;
}  // namespace

TypeDialog::TypeDialog(const MeshConfig& mesh, bool device, QWidget* parent)
    : QDialog(parent), m_mesh(mesh), m_device(device) {
  setWindowTitle(device ? tr("New device type") : tr("New link type"));
  auto* form = new QFormLayout(this);
  m_name = new QLineEdit(this);
  form->addRow(tr("Name"), m_name);
  const auto number = [&](const QString& label, double value, double max, int decimals) {
    auto* s = new QDoubleSpinBox(this);
    s->setRange(0, max);
    s->setDecimals(decimals);
    s->setValue(value);
    form->addRow(label, s);
    return s;
  };
  if (device) {
    m_label = new QLineEdit(this);
    form->addRow(tr("Label"), m_label);
    m_a = number(tr("Peak TFLOP/s fp32"), 20, 1e6, 2);
    m_b = number(tr("Peak TFLOP/s bf16"), 300, 1e6, 2);
    // The studio states memory in GiB; the config keeps its datasheet unit (memory_gb, 10^9 bytes).
    m_c = number(tr("Memory GiB"), 80e9 / kBytesPerGiB, 1e6, 2);
    m_c->setToolTip(
        tr("Device memory in GiB (2^30 bytes); saved as memory_gb in 10^9 bytes (80 GB = 74.51 GiB)"));
    m_d = number(tr("Memory bandwidth GB/s"), 2000, 1e7, 0);
  } else {
    m_a = number(tr("Bandwidth GB/s per direction"), 100, 1e6, 2);
    m_b = number(tr("Latency µs"), 5, 1e6, 2);
    m_perDevice = new QCheckBox(tr("A port per device (one NIC per GPU)"), this);
    m_perDevice->setToolTip(tr(
        "Every device has its own port of this link, so a ring collective over several devices of each node "
        "crosses nodes through all their ports at once (per_device); unchecked: the node's devices share "
        "one port"));
    form->addRow(QString(), m_perDevice);
  }
  m_error = new QLabel(this);
  m_error->setStyleSheet(QStringLiteral("color: #d32f2f"));
  m_error->setWordWrap(true);
  form->addRow(m_error);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
  form->addRow(buttons);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  connect(buttons, &QDialogButtonBox::accepted, this, [this] {
    MeshConfig trial = m_mesh;
    const Status s = m_device ? addDeviceType(trial, deviceType()) : addLinkType(trial, linkType());
    if (s) return accept();
    m_error->setText(QString::fromStdString(s.message()));
  });
}

DeviceTypeConfig TypeDialog::deviceType() const {
  DeviceTypeConfig t;
  t.name = m_name->text().trimmed().toStdString();
  t.label = m_label->text().trimmed().toStdString();
  t.peakTflopsFp32 = m_a->value();
  t.peakTflopsBf16 = m_b->value();
  t.memoryGb = m_c->value() * kBytesPerGiB / 1e9;
  t.memoryBandwidthGbs = m_d->value();
  return t;
}

LinkTypeConfig TypeDialog::linkType() const {
  return LinkTypeConfig{m_name->text().trimmed().toStdString(), m_a->value(), m_b->value(),
                        m_perDevice && m_perDevice->isChecked()};
}

}  // namespace ms
