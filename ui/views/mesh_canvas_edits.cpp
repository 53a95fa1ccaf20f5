// MeshCanvas's edits: the mesh edits behind its actions and menus, and the drop of layers on a device. Each
// goes through ProjectDocument (one undo step) or is refused with a reason shown on the canvas; see
// mesh_canvas.h. The drawing and event handling are in mesh_canvas.cpp.
#include <QMenu>

#include "plan/hardware.h"
#include "ui/models/mesh_model.h"
#include "ui/models/placement.h"
#include "ui/models/plan_analysis.h"
#include "ui/models/project_document.h"
#include "ui/views/mesh_canvas.h"

#include "plan/parameter_server.h"
#include "ui/views/mesh_canvas_items.h"
#include "ui/views/type_dialog.h"

namespace ms {

using canvas_detail::linkText;

bool MeshCanvas::applyMesh(const QString& text, const MeshConfig& mesh) {
  RunConfig next = m_doc->config();
  next.mesh = mesh;
  m_doc->setConfig(text, next);
  return true;
}

bool MeshCanvas::addNode() {
  MeshConfig mesh = m_doc->config().mesh;
  const Status s = ms::addNode(mesh, m_selectedNode);
  if (!s) return refuse(QString::fromStdString(s.message()));
  return applyMesh(tr("Add node %1").arg(QString::fromStdString(mesh.nodes.back().name)), mesh);
}

bool MeshCanvas::duplicateNode(int node) {
  MeshConfig mesh = m_doc->config().mesh;
  const Status s = ms::duplicateNode(mesh, node);
  if (!s) return refuse(QString::fromStdString(s.message()));
  return applyMesh(
      tr("Duplicate node %1").arg(QString::fromStdString(mesh.nodes[static_cast<size_t>(node)].name)), mesh);
}

bool MeshCanvas::removeNode(int node) {
  MeshConfig mesh = m_doc->config().mesh;
  const QString name = node >= 0 && node < int(mesh.nodes.size())
                           ? QString::fromStdString(mesh.nodes[static_cast<size_t>(node)].name)
                           : QString();
  const Status s = ms::removeNode(mesh, node);
  if (!s) return refuse(QString::fromStdString(s.message()));
  m_selectedNode = m_selectedDevice = -1;
  return applyMesh(tr("Remove node %1").arg(name), mesh);
}

bool MeshCanvas::addDevice(int node) {
  MeshConfig mesh = m_doc->config().mesh;
  const Status s = ms::addDevice(mesh, node);
  if (!s) return refuse(QString::fromStdString(s.message()));
  return applyMesh(
      tr("Add device to %1").arg(QString::fromStdString(mesh.nodes[static_cast<size_t>(node)].name)), mesh);
}

bool MeshCanvas::removeDevice(int device) {
  MeshConfig mesh = m_doc->config().mesh;
  const Status s = ms::removeDevice(mesh, device);
  if (!s) return refuse(QString::fromStdString(s.message()));
  m_selectedDevice = -1;
  return applyMesh(tr("Remove device %1").arg(device), mesh);
}

bool MeshCanvas::setNodeDeviceType(int node, const QString& type) {
  MeshConfig mesh = m_doc->config().mesh;
  const Status s = ms::setNodeDeviceType(mesh, node, type.toStdString());
  if (!s) return refuse(QString::fromStdString(s.message()));
  return applyMesh(tr("Set device type of %1 to %2")
                       .arg(QString::fromStdString(mesh.nodes[static_cast<size_t>(node)].name), type),
                   mesh);
}

bool MeshCanvas::defineDeviceType(const DeviceTypeConfig& type, int applyToNode) {
  MeshConfig mesh = m_doc->config().mesh;
  Status s = ms::addDeviceType(mesh, type);
  if (s && applyToNode >= 0) s = ms::setNodeDeviceType(mesh, applyToNode, type.name);
  if (!s) return refuse(QString::fromStdString(s.message()));
  return applyMesh(tr("Define device type %1").arg(QString::fromStdString(type.name)), mesh);
}

bool MeshCanvas::setLink(bool intra, const QString& name) {
  MeshConfig mesh = m_doc->config().mesh;
  const Status s = ms::setLink(mesh, intra, name.toStdString());
  if (!s) return refuse(QString::fromStdString(s.message()));
  return applyMesh(
      intra ? tr("Set intra-node link to %1").arg(name) : tr("Set inter-node link to %1").arg(name), mesh);
}

bool MeshCanvas::defineLinkType(const LinkTypeConfig& type, bool intra) {
  MeshConfig mesh = m_doc->config().mesh;
  Status s = ms::addLinkType(mesh, type);
  if (s) s = ms::setLink(mesh, intra, type.name);
  if (!s) return refuse(QString::fromStdString(s.message()));
  return applyMesh(tr("Define link type %1").arg(QString::fromStdString(type.name)), mesh);
}

void MeshCanvas::fillDeviceTypeMenu(QMenu* menu, int node) {
  menu->clear();
  const RunConfig& config = m_doc->config();
  if (node < 0 || node >= int(config.mesh.nodes.size())) return;
  const std::string current = config.mesh.nodes[static_cast<size_t>(node)].device;
  for (const std::string& name : deviceTypeNames(config.mesh)) {
    const QString type = QString::fromStdString(name);
    QAction* a = menu->addAction(type, this, [this, node, type] { setNodeDeviceType(node, type); });
    a->setCheckable(true);
    a->setChecked(name == current);
  }
  menu->addSeparator();
  menu->addAction(tr("New device type..."), this, [this, node] { askDeviceType(node); });
}

void MeshCanvas::fillLinkMenu(QMenu* menu, bool intra) {
  menu->clear();
  const MeshConfig& mesh = m_doc->config().mesh;
  const std::string& current = intra ? mesh.intraLink : mesh.interLink;
  for (const std::string& name : linkTypeNames(mesh)) {
    const QString link = QString::fromStdString(name);
    QAction* a = menu->addAction(linkText(mesh, name), this, [this, intra, link] { setLink(intra, link); });
    a->setCheckable(true);
    a->setChecked(name == current);
  }
  menu->addSeparator();
  menu->addAction(tr("New link type..."), this, [this, intra] { askLinkType(intra); });
}

void MeshCanvas::askDeviceType(int node) {
  TypeDialog dialog(m_doc->config().mesh, true, this);
  if (dialog.exec() == QDialog::Accepted) defineDeviceType(dialog.deviceType(), node);
}

void MeshCanvas::askLinkType(bool intra) {
  TypeDialog dialog(m_doc->config().mesh, false, this);
  if (dialog.exec() == QDialog::Accepted) defineLinkType(dialog.linkType(), intra);
}

namespace {

// Every server's node name: the config's placement, or the default one (plan/parameter_server.h serverNode).
std::vector<std::string> serverNodeNames(const RunConfig& c) {
  std::vector<std::string> out;
  for (int s = 0; s < c.parallel.servers; ++s)
    out.push_back(c.mesh.nodes[static_cast<size_t>(serverNode(c, s))].name);
  return out;
}

}  // namespace

bool MeshCanvas::addServer(int node) {
  const RunConfig& c = m_doc->config();
  if (c.parallel.mode != ParallelMode::ParameterServer)
    return refuse(tr("Servers belong to the parameter-server mode: choose it in the inspector first"));
  if (node < 0 || node >= static_cast<int>(c.mesh.nodes.size())) return refuse(tr("No such node"));
  RunConfig next = c;
  next.parallel.serverNodes = serverNodeNames(c);
  next.parallel.serverNodes.push_back(c.mesh.nodes[static_cast<size_t>(node)].name);
  next.parallel.servers += 1;
  if (next.parallel.servers > 1) next.training.gradClip = 0;  // no server knows the global norm
  m_doc->setConfig(
      tr("Add a server on %1").arg(QString::fromStdString(c.mesh.nodes[static_cast<size_t>(node)].name)),
      next);
  return true;
}

bool MeshCanvas::removeServer(int node) {
  const RunConfig& c = m_doc->config();
  if (c.parallel.mode != ParallelMode::ParameterServer)
    return refuse(tr("Servers belong to the parameter-server mode"));
  if (node < 0 || node >= static_cast<int>(c.mesh.nodes.size())) return refuse(tr("No such node"));
  if (c.parallel.servers <= 1) return refuse(tr("The run needs at least one server"));
  std::vector<std::string> names = serverNodeNames(c);
  const std::string& name = c.mesh.nodes[static_cast<size_t>(node)].name;
  for (int s = static_cast<int>(names.size()) - 1; s >= 0; --s)
    if (names[static_cast<size_t>(s)] == name) {
      RunConfig next = c;
      names.erase(names.begin() + s);
      next.parallel.serverNodes = names;
      next.parallel.servers -= 1;
      m_doc->setConfig(tr("Remove a server from %1").arg(QString::fromStdString(name)), next);
      return true;
    }
  return refuse(tr("No server runs on %1").arg(QString::fromStdString(name)));
}

bool MeshCanvas::dropLayers(int first, int last, int device) {
  if (device < 0) return refuse(tr("Drop the layers on a device tile: empty space runs no pipeline stage"));
  if (m_doc->config().parallel.mode == ParallelMode::ParameterServer)
    return refuse(
        tr("Parameter-server workers hold the whole model: layers are not placed on devices (the "
           "servers split them by bytes)"));
  const int stage = stageOfDevice(device);
  if (stage < 0) {
    if (!m_ranks.ok()) return refuse(tr("Device %1 runs no rank: %2").arg(device).arg(m_ranks.error));
    return refuse(
        tr("Device %1 is idle (no rank runs on it): drop the layers on a device of a pipeline stage")
            .arg(device));
  }
  const RunConfig& config = m_doc->config();
  const std::vector<std::string> names = modelLayerNames(config.model);
  const auto name = [&](int i) {
    return i >= 0 && i < int(names.size()) ? QString::fromStdString(names[static_cast<size_t>(i)])
                                           : QString::number(i);
  };
  const QString what = first == last ? name(first) : tr("%1..%2").arg(name(first), name(last));
  std::vector<std::string> changes;
  const auto placed = placeLayers(config, first, last, stage, &changes);
  if (!placed)
    return refuse(tr("Cannot place %1 on stage %2: %3")
                      .arg(what)
                      .arg(stage)
                      .arg(QString::fromStdString(placed.message())));
  if (*placed == config) {
    showMessage(tr("%1 already on stage %2").arg(what).arg(stage), false);
    return true;
  }
  const QString text = tr("Place layers %1 on stage %2").arg(what).arg(stage);
  m_doc->setConfig(text, *placed);
  QString description = text;
  for (const std::string& c : changes) description += QStringLiteral("\n") + QString::fromStdString(c);
  showMessage(description, false);
  emit layersPlaced(description);
  return true;
}

// --- Interaction ---

}  // namespace ms
